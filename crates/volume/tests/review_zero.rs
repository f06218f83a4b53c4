//! Review of the known-zero blocks (zero.rs, branch samehost-speed): a leased block
//! must never change under its lease (background zeroing included), and pages handed
//! out by `reserve_pages` read zero wherever their holder does not write, while other
//! threads delete files, zero free blocks ahead and hold leases.

mod common;
use common::*;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_volume::*;

struct Image(PathBuf);

impl Image {
    fn new(tag: &str, size: u64) -> Image {
        let p = PathBuf::from(format!(
            "/dev/shm/zcfs-test-review-zero-{tag}-{}.img",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        Volume::mkfs(&p, size, &small_mkfs()).unwrap();
        Image(p)
    }
    fn open(&self, cfg: VolumeConfig) -> Arc<Volume> {
        Volume::open(&self.0, cfg).unwrap()
    }
    /// Bytes of the image file (the same page cache as the volume's mapping).
    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let f = std::fs::File::open(&self.0).unwrap();
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, off).unwrap();
        buf
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Every leased byte of `lease` still holds `byte`.
fn lease_holds(img: &Image, lease: &Lease, byte: u8) -> bool {
    lease.extents().iter().filter(|e| !e.hole).all(|e| {
        img.read(e.image_offset, e.len as usize)
            .iter()
            .all(|&b| b == byte)
    })
}

/// A lease pins its blocks against an overwrite in every configuration: with
/// `no_log` (measurement mode) the overwritten blocks used to go straight back to the
/// allocator, so the idle-time zeroing (clean_free_blocks) zeroed bytes a same-host
/// reader was reading in place.
#[test]
fn a_leased_block_is_not_zeroed_while_free_without_the_log() {
    let img = Image::new("nolog", 16 << 20);
    let cfg = VolumeConfig {
        no_log: true,
        ..VolumeConfig::synchronous()
    };
    let vol = img.open(cfg);
    let a = new_file(&vol, ROOT_INO, b"a");
    let len = 256 << 10;
    vol.write(&Cred::ROOT, a, 0, &vec![0xaa; len]).unwrap();
    let lease = vol.lease(a, 0, len).unwrap();
    assert!(lease_holds(&img, &lease, 0xaa));
    // Overwrite the whole file: its old blocks are released, but leased.
    vol.write(&Cred::ROOT, a, 0, &vec![0xbb; len]).unwrap();
    for _ in 0..10_000 {
        if vol.clean_free_blocks(16).unwrap() == 0 {
            break;
        }
    }
    assert!(
        lease_holds(&img, &lease, 0xaa),
        "a leased block changed under its lease (zeroed while 'free')"
    );
    // Nor is it handed out to be filled.
    let leased: std::collections::HashSet<u64> = lease
        .extents()
        .iter()
        .flat_map(|e| (0..e.len / 4096).map(move |k| e.image_offset + k * 4096))
        .collect();
    let p = vol.reserve_pages_owned(1024).unwrap();
    assert!(
        p.image_offsets().iter().all(|o| !leased.contains(o)),
        "a leased block was reserved"
    );
    drop(p);
    drop(lease);
    // Once the lease is gone the blocks come back.
    vol.checkpoint_now().unwrap();
    assert_fsck_clean(&vol);
}

/// Threads at once: files written whole and deleted, free blocks zeroed ahead, pages
/// reserved, partly filled and committed, leases held across overwrites. Every
/// reserved page reads zero, every committed page shows zeros where it was not
/// written, every lease keeps its bytes; fsck clean at the end.
fn churn(cfg: VolumeConfig, tag: &str) {
    let img = Image::new(tag, 64 << 20);
    let vol = img.open(cfg);
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut threads = Vec::new();
    // Writer/deleter: whole files of a non-zero byte, deleted.
    {
        let (vol, stop) = (vol.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            for i in 0..400u32 {
                if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                    break;
                }
                let name = format!("d{i}");
                let ino = vol
                    .create(&Cred::ROOT, ROOT_INO, name.as_bytes(), 0o644, 0)
                    .unwrap()
                    .ino;
                let _ = vol.write(&Cred::ROOT, ino, 0, &vec![0xd0 | (i % 16) as u8; 1 << 20]);
                vol.unlink(&Cred::ROOT, ROOT_INO, name.as_bytes()).unwrap();
                if i % 8 == 0 {
                    vol.checkpoint_now().unwrap();
                }
            }
        }));
    }
    // Cleaner: the same-host idle loop's steps.
    {
        let (vol, stop) = (vol.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            for _ in 0..200_000 {
                if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                    break;
                }
                if vol.clean_free_blocks(16).unwrap_or(0) == 0 {
                    std::thread::yield_now();
                }
            }
        }));
    }
    // Leaseholder: a file overwritten under a lease keeps its leased bytes.
    {
        let (vol, stop) = (vol.clone(), stop.clone());
        let path = img.0.clone();
        threads.push(std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            let l = new_file(&vol, ROOT_INO, b"leased");
            for i in 0..300u32 {
                if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                    break;
                }
                let byte = 0x30 + (i % 64) as u8;
                vol.write(&Cred::ROOT, l, 0, &vec![byte; 64 << 10]).unwrap();
                let lease = vol.lease(l, 0, 64 << 10).unwrap();
                vol.write(&Cred::ROOT, l, 0, &vec![0x01; 64 << 10]).unwrap();
                vol.checkpoint_now().unwrap();
                std::thread::yield_now();
                for e in lease.extents().iter().filter(|e| !e.hole) {
                    let mut buf = vec![0u8; e.len as usize];
                    f.read_exact_at(&mut buf, e.image_offset).unwrap();
                    assert!(buf.iter().all(|&b| b == byte), "a leased block changed");
                }
            }
        }));
    }
    // Reserver: pages zero on the way out, committed partly written.
    {
        let (vol, stop) = (vol.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let r = new_file(&vol, ROOT_INO, b"r");
            for i in 0..400u64 {
                if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                    break;
                }
                let n = [1usize, 15, 16, 64, 256][i as usize % 5];
                let p = match vol.reserve_pages_owned(n) {
                    Ok(p) => p,
                    Err(FsError::NoSpace) => continue,
                    Err(e) => panic!("reserve: {e}"),
                };
                let mut buf = p.into_page_buf(&vol).unwrap();
                for k in 0..n {
                    let page = buf.page_mut(k);
                    assert!(page.iter().all(|&b| b == 0), "a reserved page is not zero");
                    page[..100].fill(0x77);
                }
                let off = (i % 64) * (256 << 12);
                let mut t = PflushTxn::default();
                t.pflush_add(r, off, buf, None).unwrap();
                vol.pflush_commit(t).unwrap();
                let mut got = vec![0u8; n * 4096];
                vol.read(r, off, &mut got).unwrap();
                for page in got.chunks(4096) {
                    assert!(page[..100].iter().all(|&b| b == 0x77));
                    assert!(
                        page[100..].iter().all(|&b| b == 0),
                        "a committed page shows bytes nobody wrote there"
                    );
                }
            }
        }));
    }
    let mut failed = None;
    for t in threads {
        if let Err(e) = t.join() {
            stop.store(true, Ordering::Relaxed);
            failed.get_or_insert(e);
        }
    }
    if let Some(e) = failed {
        std::panic::resume_unwind(e);
    }
    vol.sync().unwrap();
    assert_fsck_clean(&vol);
    let s = vol.stats.snapshot();
    eprintln!(
        "{tag}: background zeroed {}, reserved clean {}, reserved zeroed {}",
        s.background_zeroed_blocks, s.reserve_clean_blocks, s.reserve_zeroed_blocks
    );
    assert!(s.background_zeroed_blocks > 0 && s.reserve_clean_blocks > 0);
}

#[test]
fn churn_synchronous() {
    churn(VolumeConfig::synchronous(), "sync");
}

#[test]
fn churn_batched() {
    churn(VolumeConfig::default(), "batched");
}

/// Crash model: free blocks zeroed in idle time (ordinary stores, never written back
/// on their own), then handed out clean, filled only in part and committed. In every
/// image a power failure could leave, the file is either absent of the pages (before
/// the commit) or shows the written bytes and zeros: never the deleted file's bytes
/// that the unflushed zeros covered.
#[test]
fn zeros_of_idle_cleaning_are_durable_with_the_commit_that_places_them() {
    use zcfs_pmem::crash::{for_each_crash_image, CrashConfig};
    const PAGES: usize = 16; // CLEAN_FIRST_MIN: served from clean blocks
    let vol = memory_volume(512 << 10, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    // A deleted file's bytes in (almost) every free block.
    let free = vol.statfs().bfree as usize;
    let d = new_file(&vol, ROOT_INO, b"d");
    let fill = (free - 40) * 4096;
    vol.write(&Cred::ROOT, d, 0, &vec![0xee; fill]).unwrap();
    vol.unlink(&Cred::ROOT, ROOT_INO, b"d").unwrap();
    vol.checkpoint_now().unwrap();
    // SAFETY: this thread alone uses the volume while recording.
    unsafe { vol.test_door().start_recording() };
    for _ in 0..1000 {
        if vol.clean_free_blocks(16).unwrap() == 0 {
            break;
        }
    }
    assert!(vol.clean_blocks() >= PAGES as u64);
    let p = vol.reserve_pages_owned(PAGES).unwrap();
    let mut buf = p.into_page_buf(&vol).unwrap();
    for k in 0..PAGES {
        assert!(buf.page_mut(k).iter().all(|&b| b == 0));
        buf.page_mut(k)[..100].fill(0x77);
    }
    let mut t = PflushTxn::default();
    t.pflush_add(f, 0, buf, None).unwrap();
    vol.pflush_commit(t).unwrap();
    vol.sync().unwrap();
    let s = vol.stats.snapshot();
    assert_eq!(s.reserve_clean_blocks, PAGES as u64, "all came clean");
    let rec = vol.test_door().take_recording().unwrap();
    vol.abandon();
    drop(vol);
    let cfg = CrashConfig {
        pair_limit: 12,
        sampled_pairs: 48,
        random_subsets: 8,
        seed: 0xc1ea,
    };
    let mut states = 0;
    let mut bad = Vec::new();
    for_each_crash_image(&rec, &cfg, |pt, img| {
        states += 1;
        let vol = Volume::open_region(Region::from_image(img), VolumeConfig::synchronous())
            .expect("mounts");
        vol.abandon();
        let f = vol.lookup(&Cred::ROOT, ROOT_INO, b"f").unwrap().ino;
        let mut got = vec![0u8; PAGES * 4096];
        let n = vol.read(f, 0, &mut got).unwrap();
        if n != 0 {
            assert_eq!(n, PAGES * 4096);
            for page in got.chunks(4096) {
                if page[..100].iter().any(|&b| b != 0x77) || page[100..].iter().any(|&b| b != 0) {
                    bad.push(format!(
                        "fence {}: a committed page shows other bytes",
                        pt.fence
                    ));
                    break;
                }
            }
        }
        let report = zcfs_volume::fsck::check_volume(&vol);
        if !report.is_clean() {
            bad.push(format!("fence {}: fsck {:?}", pt.fence, report.problems));
        }
        bad.len() < 5
    });
    eprintln!("{states} crash states, {} violations", bad.len());
    assert!(states > 0);
    assert!(bad.is_empty(), "{bad:#?}");
}
