//! Regression tests for the defects of issue 8 that live in the volume: each reproduces
//! what a review found on the earlier main and checks the fix.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use zcfs_volume::fsck::fsck_path;
use zcfs_volume::*;

fn scratch(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("zcfs-defects-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// A thread reading the first MiB of `ino` that stalls inside the read (as on a socket
/// nobody reads) until told to go on; it then says whether every byte was `byte`.
/// Returns once the reader is inside the read.
fn stalled_reader(
    vol: &std::sync::Arc<Volume>,
    ino: u64,
    byte: u8,
) -> (std::thread::JoinHandle<bool>, mpsc::Sender<()>) {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let v = vol.clone();
    let reader = std::thread::spawn(move || {
        v.read_with(ino, 0, 1 << 20, |slices| {
            entered_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            slices.iter().all(|s| s.iter().all(|&x| x == byte))
        })
        .unwrap()
    });
    entered_rx.recv().unwrap();
    (reader, go_tx)
}

/// A fresh 16 MiB volume in file `scratch(name)`, open synchronously, with a file "f"
/// holding `data`: the path, the volume, f's inode.
fn file_volume_with(name: &str, data: &[u8]) -> (std::path::PathBuf, std::sync::Arc<Volume>, u64) {
    let path = scratch(name);
    Volume::mkfs(&path, 16 << 20, &small_mkfs()).unwrap();
    let vol = Volume::open(&path, VolumeConfig::synchronous()).unwrap();
    let f = new_file(&vol, ROOT_INO, b"f");
    vol.write(&Cred::ROOT, f, 0, data).unwrap();
    (path, vol, f)
}

/// Defect 1: a write larger than one log entry can hold used to fail with TooBig after
/// mapping its (then freed) blocks into the file, so the next file's data showed
/// through. Now it is split into pieces and succeeds; nothing leaks between files.
#[test]
fn d1_a_write_larger_than_the_log_succeeds_and_nothing_leaks() {
    let vol = memory_volume_with(64 << 20, &small_mkfs(), VolumeConfig::synchronous());
    assert_eq!(vol.geometry().ring_len(), 32 << 10);
    let a = new_file(&vol, ROOT_INO, b"a");
    assert_eq!(
        vol.write(&Cred::ROOT, a, 0, &vec![0xAA; 12 << 20]).unwrap(),
        12 << 20
    );
    let b = new_file(&vol, ROOT_INO, b"b");
    for i in 0..12u64 {
        vol.write(&Cred::ROOT, b, i << 20, &vec![0xBB; 1 << 20])
            .unwrap();
    }
    let mut buf = vec![0u8; 12 << 20];
    assert_eq!(vol.read(a, 0, &mut buf).unwrap(), 12 << 20);
    assert!(buf.iter().all(|&x| x == 0xAA), "file a changed");
    assert_eq!(vol.read(b, 0, &mut buf).unwrap(), 12 << 20);
    assert!(buf.iter().all(|&x| x == 0xBB));
    assert_fsck_clean(&vol);
    // And after a remount from the image (the pieces replay as separate entries).
    let img = image_of(&vol);
    vol.abandon();
    let again = Volume::open_region(Region::from_image(&img), VolumeConfig::synchronous()).unwrap();
    assert_eq!(again.read(a, 0, &mut buf).unwrap(), 12 << 20);
    assert!(buf.iter().all(|&x| x == 0xAA));
    assert_fsck_clean(&again);
}

/// Defect 1, the failing half: a write that fails (here: no room for the map nodes a
/// small write at a huge offset needs) changes nothing and leaks nothing, and the
/// blocks it had reserved never show up in another file.
#[test]
fn d1_a_failed_write_changes_nothing_and_leaks_nothing() {
    let vol = memory_volume_with(8 << 20, &small_mkfs(), VolumeConfig::synchronous());
    let a = new_file(&vol, ROOT_INO, b"a");
    vol.write(&Cred::ROOT, a, 0, b"keep me").unwrap();
    // Fill the volume but for 3 blocks: a 1-block write at 1 TiB needs 1 data block
    // and 5 map nodes.
    let filler = new_file(&vol, ROOT_INO, b"filler");
    let free = vol.statfs().bfree;
    let keep = 3u64;
    vol.write(
        &Cred::ROOT,
        filler,
        0,
        &vec![7u8; ((free - keep - 2) * 4096) as usize],
    )
    .unwrap();
    vol.checkpoint_now().unwrap();
    let before = dump_volume(&vol).unwrap();
    let bfree = vol.statfs().bfree;
    assert!(bfree <= keep + 2, "{bfree}");
    let r = vol.write(&Cred::ROOT, a, 1 << 40, &[0xEE; 100]);
    assert!(matches!(r, Err(FsError::NoSpace)), "{r:?}");
    assert_eq!(
        dump_volume(&vol).unwrap(),
        before,
        "a failed write changed the tree"
    );
    assert_eq!(vol.statfs().bfree, bfree, "a failed write leaked blocks");
    assert_eq!(vol.getattr(a).unwrap().size, 7);
    // Truncate that needs a new last block, with no block left: fails, changes nothing.
    vol.write(
        &Cred::ROOT,
        filler,
        0,
        &vec![1u8; (vol.statfs().bfree * 4096) as usize],
    )
    .unwrap_or(0);
    let before = dump_volume(&vol).unwrap();
    let bfree = vol.statfs().bfree;
    if bfree == 0 {
        let r = vol.truncate(&Cred::ROOT, filler, 4096 + 100);
        assert!(matches!(r, Err(FsError::NoSpace)), "{r:?}");
        assert_eq!(dump_volume(&vol).unwrap(), before);
        assert_eq!(vol.statfs().bfree, bfree);
    }
    // Freeing the filler and writing a new file shows no byte of the failed writes.
    vol.unlink(&Cred::ROOT, ROOT_INO, b"filler").unwrap();
    let c = new_file(&vol, ROOT_INO, b"c");
    vol.write(&Cred::ROOT, c, 0, &vec![0x11; 1 << 20]).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    vol.read(c, 0, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 0x11));
    assert_fsck_clean(&vol);
}

/// Defect 2: a reservation copied the untouched part of an edge block when it was made
/// and again at commit only if the block *number* had changed; a checkpoint could free
/// that block and the allocator hand the same number to a newer write (ABA), so stale
/// bytes were committed over newer ones.
#[test]
fn d2_concurrent_partial_writes_to_one_block_keep_every_byte() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    vol.write(&Cred::ROOT, f, 0, &[0x11; 4096]).unwrap();
    let mut r = vol.reserve_write(&Cred::ROOT, f, 0, 100).unwrap();
    vol.write(&Cred::ROOT, f, 200, &[0x22; 10]).unwrap();
    vol.checkpoint_now().unwrap();
    vol.write(&Cred::ROOT, f, 300, &[0x33; 10]).unwrap();
    r.fill_from(&[0x44; 100]);
    r.commit().unwrap();
    let mut buf = [0u8; 4096];
    vol.read(f, 0, &mut buf).unwrap();
    assert!(buf[..100].iter().all(|&x| x == 0x44));
    assert!(
        buf[200..210].iter().all(|&x| x == 0x22),
        "{:x?}",
        &buf[200..210]
    );
    assert!(
        buf[300..310].iter().all(|&x| x == 0x33),
        "{:x?}",
        &buf[300..310]
    );
    assert!(buf[100..200].iter().all(|&x| x == 0x11));
    assert_fsck_clean(&vol);
}

/// Defect 3: the record count of a log entry was clamped to 16 bits, and truncating a
/// large sparse file produced one record per dropped leaf. Now a truncate or unlink
/// costs a bounded number of records, however large the file, and recovers whole.
#[test]
fn d3_truncate_and_unlink_of_a_large_sparse_file_recover_whole() {
    let vol = memory_volume_with(
        64 << 20,
        &mkfs_with(64, 16 << 10),
        VolumeConfig::synchronous(),
    );
    let f = new_file(&vol, ROOT_INO, b"sparse");
    let g = new_file(&vol, ROOT_INO, b"other");
    // One block in each of 2,000 leaves: the old truncate wrote 2,000+ records.
    for leaf in 0..2000u64 {
        vol.write(&Cred::ROOT, f, leaf * 512 * 4096, &leaf.to_le_bytes())
            .unwrap();
        vol.write(&Cred::ROOT, g, leaf * 512 * 4096, &leaf.to_le_bytes())
            .unwrap();
    }
    vol.truncate(&Cred::ROOT, f, 4096 * 3).unwrap();
    vol.unlink(&Cred::ROOT, ROOT_INO, b"other").unwrap();
    let img = image_of(&vol);
    vol.abandon();
    let again = Volume::open_region(Region::from_image(&img), VolumeConfig::synchronous()).unwrap();
    assert_eq!(again.getattr(f).unwrap().size, 4096 * 3);
    assert!(matches!(
        again.lookup(&Cred::ROOT, ROOT_INO, b"other"),
        Err(FsError::NotFound)
    ));
    let mut buf = [0u8; 8];
    again.read(f, 0, &mut buf).unwrap();
    assert_eq!(u64::from_le_bytes(buf), 0);
    assert_fsck_clean(&again);
    // The blocks of both came back (data + nodes), and only the kept one is used
    // (statfs counts the metadata reserve as used).
    let s = again.statfs();
    assert!(s.bfree + zcfs_volume::metadata_reserve(s.blocks) > s.blocks - 10);
}

/// Defect 4: two processes could open one image read-write (two mounts lost half of
/// their files). Now the second opener is refused, naming the holder; fsck of a live
/// volume says so, and --repair refuses; mkfs refuses too and leaves the volume alone.
#[test]
fn d4_a_second_opener_is_refused_naming_the_holder() {
    let (path, vol, f) = file_volume_with("second-opener", b"mine");
    let pid = std::process::id().to_string();
    let busy = |r: Result<std::sync::Arc<Volume>>| match r {
        Err(FsError::Busy(m)) => m,
        other => panic!("expected Busy, got {:?}", other.map(|_| ())),
    };
    let m = busy(Volume::open(&path, VolumeConfig::default()));
    assert!(m.contains(&pid) && m.contains("in use"), "{m}");
    let m = busy(Volume::open(
        &path,
        VolumeConfig {
            read_only: true,
            ..Default::default()
        },
    ));
    assert!(m.contains(&pid), "{m}");
    for repair in [false, true] {
        match fsck_path(&path, repair) {
            Err(FsError::Busy(m)) => assert!(m.contains("live") && m.contains(&pid), "{m}"),
            other => panic!("fsck of a live volume: {:?}", other.map(|r| r.problems)),
        }
    }
    assert!(matches!(
        Volume::mkfs(&path, 16 << 20, &small_mkfs()),
        Err(FsError::Busy(_))
    ));
    assert_eq!(read_holder(&path).unwrap().pid, std::process::id());
    drop(vol);
    assert!(
        read_holder(&path).is_none(),
        "a clean close clears the record"
    );
    let vol = Volume::open(&path, VolumeConfig::synchronous()).unwrap();
    let mut buf = [0u8; 4];
    vol.read(f, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"mine");
    drop(vol);
    assert!(fsck_path(&path, false).unwrap().is_clean());
    std::fs::remove_file(&path).unwrap();
}

/// Defect 5 (volume side): a reader used to hold the volume's read lock while its
/// callback ran (the server sends a reply from there), so a stalled reader blocked the
/// next writer and every request behind it. Now the callback runs without the lock,
/// with the blocks it reads pinned: writers, truncates and checkpoints go on, and the
/// pinned bytes stay intact until the reader is done.
#[test]
fn d5_a_stalled_reader_blocks_nobody_and_its_blocks_stay_intact() {
    let vol = memory_volume(16 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let base = vol.statfs().bfree;
    vol.write(&Cred::ROOT, f, 0, &vec![0x5A; 1 << 20]).unwrap();
    let (reader, go_tx) = stalled_reader(&vol, f, 0x5A);
    // Meanwhile: the file is cut and rewritten, checkpoints run, other files are
    // written with new data that would reuse the freed blocks.
    let t = Instant::now();
    vol.truncate(&Cred::ROOT, f, 0).unwrap();
    vol.checkpoint_now().unwrap();
    for i in 0..8 {
        let g = vol
            .create(&Cred::ROOT, ROOT_INO, format!("g{i}").as_bytes(), 0o644, 0)
            .unwrap()
            .ino;
        vol.write(&Cred::ROOT, g, 0, &vec![0xC3; 1 << 20]).unwrap();
        vol.checkpoint_now().unwrap();
    }
    vol.getattr(f).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "writers were blocked"
    );
    go_tx.send(()).unwrap();
    assert!(reader.join().unwrap(), "a pinned block was overwritten");
    // Once the reader is done, every block comes back.
    for i in 0..8 {
        vol.unlink(&Cred::ROOT, ROOT_INO, format!("g{i}").as_bytes())
            .unwrap();
    }
    vol.checkpoint_now().unwrap();
    assert_eq!(vol.statfs().bfree, base, "blocks leaked");
    assert_fsck_clean(&vol);
}

/// Defect 6 (volume side): an inode referenced by a frontend (an open file, a kernel's
/// lookup) outlives the removal of its last name, so an open that resolved the name
/// before a rename replaced it still gets the old file.
#[test]
fn d6_a_referenced_inode_replaced_by_rename_lives_until_forgotten() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let old = vol
        .create_held(&Cred::ROOT, ROOT_INO, b"target", 0o644, 0)
        .unwrap();
    vol.write(&Cred::ROOT, old.ino, 0, b"old").unwrap();
    let tmp = vol.create(&Cred::ROOT, ROOT_INO, b"tmp", 0o644, 0).unwrap();
    vol.write(&Cred::ROOT, tmp.ino, 0, b"new").unwrap();
    vol.rename(
        &Cred::ROOT,
        ROOT_INO,
        b"tmp",
        ROOT_INO,
        b"target",
        RenameFlags::default(),
    )
    .unwrap();
    // The kernel still holds its lookup: the old inode opens and reads.
    vol.open_handle(old.ino).unwrap();
    let mut buf = [0u8; 3];
    vol.read(old.ino, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"old");
    assert_eq!(vol.getattr(old.ino).unwrap().nlink, 0);
    assert!(
        vol.hold(old.ino, old.generation as u32 + 1).is_err(),
        "wrong generation accepted"
    );
    assert_fsck_clean(&vol);
    vol.release_handle(old.ino).unwrap();
    vol.getattr(old.ino).unwrap();
    vol.forget(old.ino, 1).unwrap();
    assert!(matches!(vol.getattr(old.ino), Err(FsError::Stale)));
    // A directory replaced while referenced lives on too (empty, link count 0).
    let d1 = vol.mkdir(&Cred::ROOT, ROOT_INO, b"d1", 0o755).unwrap();
    let d2 = vol.mkdir_held(&Cred::ROOT, ROOT_INO, b"d2", 0o755).unwrap();
    vol.rename(
        &Cred::ROOT,
        ROOT_INO,
        b"d1",
        ROOT_INO,
        b"d2",
        RenameFlags::default(),
    )
    .unwrap();
    assert_eq!(vol.getattr(d2.ino).unwrap().nlink, 0);
    assert!(matches!(
        vol.create(&Cred::ROOT, d2.ino, b"x", 0o644, 0),
        Err(FsError::NotFound)
    ));
    assert_eq!(
        vol.lookup(&Cred::ROOT, ROOT_INO, b"d2").unwrap().ino,
        d1.ino
    );
    assert_fsck_clean(&vol);
    vol.forget(d2.ino, 1).unwrap();
    assert!(matches!(vol.getattr(d2.ino), Err(FsError::Stale)));
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_fsck_clean(&vol);
}

/// Defect 11: a failed msync was logged and ignored, so fsync reported success. Now the
/// operation that meets it gets EIO, fsync reports EIO, and the volume turns read-only.
#[test]
fn d11_a_persistence_failure_is_eio_and_turns_the_volume_read_only() {
    let (path, vol, f) = file_volume_with("persist-fail", b"durable");
    vol.test_door().inject_fence_failure(1);
    let r = vol.write(&Cred::ROOT, f, 0, b"lost?");
    assert_eq!(r.map_err(|e| e.errno()), Err(libc::EIO));
    assert!(vol.has_failed() && vol.info().failed);
    assert_eq!(vol.fsync(f).map_err(|e| e.errno()), Err(libc::EIO));
    assert_eq!(
        vol.create(&Cred::ROOT, ROOT_INO, b"g", 0o644, 0)
            .map_err(|e| e.errno()),
        Err(libc::EROFS)
    );
    vol.getattr(f).unwrap(); // reads go on
    drop(vol);
    // Not closed cleanly: the next open recovers what was durable.
    let vol = Volume::open(&path, VolumeConfig::synchronous()).unwrap();
    assert!(!vol.recovery_report().was_clean);
    let mut buf = [0u8; 7];
    vol.read(f, 0, &mut buf).unwrap();
    assert!(&buf == b"durable" || &buf[..5] == b"lost?");
    assert_fsck_clean(&vol);
    drop(vol);
    std::fs::remove_file(&path).unwrap();
}

/// Defect 12: fsck called a volume clean when a superblock copy was garbage (it used
/// the other copy silently). Now that is a problem, and --repair rewrites the copy.
#[test]
fn d12_fsck_reports_a_damaged_superblock_copy_and_repairs_it() {
    let path = scratch("sb");
    Volume::mkfs(&path, 16 << 20, &small_mkfs()).unwrap();
    drop(Volume::open(&path, VolumeConfig::synchronous()).unwrap());
    for copy in [0u64, 4096] {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0x5Au8; 300], copy + 40).unwrap();
        drop(f);
        let r = fsck_path(&path, false).unwrap();
        assert!(
            !r.is_clean(),
            "garbage superblock copy at {copy} called clean"
        );
        assert!(
            r.problems.iter().any(|p| p.starts_with("superblock copy")),
            "{:?}",
            r.problems
        );
        let r = fsck_path(&path, true).unwrap();
        assert!(r.is_clean(), "{:?}", r.problems);
        assert!(r.repaired.iter().any(|p| p.contains("superblock copy")));
        assert!(fsck_path(&path, false).unwrap().is_clean());
    }
    std::fs::remove_file(&path).unwrap();
}

/// Limits at their bound: MAX_LINKS links, then EMLINK, nothing changed.
#[test]
fn links_stop_at_max_links() {
    let vol = memory_volume_with(64 << 20, &mkfs_with(64, 1 << 20), VolumeConfig::default());
    let f = new_file(&vol, ROOT_INO, b"f");
    for i in 1..MAX_LINKS {
        vol.link(&Cred::ROOT, f, ROOT_INO, format!("l{i}").as_bytes())
            .unwrap();
    }
    assert_eq!(vol.getattr(f).unwrap().nlink, MAX_LINKS);
    assert!(matches!(
        vol.link(&Cred::ROOT, f, ROOT_INO, b"one-more"),
        Err(FsError::TooManyLinks)
    ));
    assert!(matches!(
        vol.lookup(&Cred::ROOT, ROOT_INO, b"one-more"),
        Err(FsError::NotFound)
    ));
    assert_fsck_clean(&vol);
}

/// A reservation never exceeds MAX_RESERVATION; a write of exactly that size works.
#[test]
fn reservation_limit_is_enforced_at_its_bound() {
    let vol = memory_volume(MAX_RESERVATION + (8 << 20), VolumeConfig::default());
    let f = new_file(&vol, ROOT_INO, b"f");
    assert!(matches!(
        vol.reserve_write(&Cred::ROOT, f, 0, MAX_RESERVATION + 1),
        Err(FsError::Invalid(_))
    ));
    let mut r = vol
        .reserve_write(&Cred::ROOT, f, 0, MAX_RESERVATION)
        .unwrap();
    r.fill_from(&vec![3u8; MAX_RESERVATION]);
    assert_eq!(r.commit().unwrap(), MAX_RESERVATION);
    assert_fsck_clean(&vol);
}

/// Pieces of a large write are each atomic, and a reader never sees the write half
/// applied while it runs (the pieces commit under one lock).
#[test]
fn a_large_write_is_whole_to_concurrent_readers() {
    let vol = memory_volume_with(64 << 20, &small_mkfs(), VolumeConfig::default());
    let f = new_file(&vol, ROOT_INO, b"f");
    vol.write(&Cred::ROOT, f, 0, &vec![1u8; 8 << 20]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (v, s) = (vol.clone(), stop.clone());
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 8 << 20];
        let mut mixed = 0;
        while !s.load(Ordering::Relaxed) {
            v.read(f, 0, &mut buf).unwrap();
            if buf[0] != buf[buf.len() - 1] {
                mixed += 1;
            }
        }
        mixed
    });
    for round in 2..12u8 {
        vol.write(&Cred::ROOT, f, 0, &vec![round; 8 << 20]).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert_eq!(reader.join().unwrap(), 0, "a reader saw a write half done");
    assert_fsck_clean(&vol);
}

/// Found while testing defect 5's fix: pins that named points in time (epochs) kept
/// every block freed after a stalled reader began, so a reader stalled on a socket for
/// its whole timeout could run the volume out of space for every writer. Pins name the
/// blocks a reader uses: writers elsewhere reuse what they free.
#[test]
fn d5_a_stalled_reader_pins_only_its_own_blocks() {
    let vol = memory_volume(16 << 20, VolumeConfig::synchronous());
    let a = new_file(&vol, ROOT_INO, b"a");
    vol.write(&Cred::ROOT, a, 0, &vec![0xA1; 1 << 20]).unwrap();
    let b = new_file(&vol, ROOT_INO, b"b");
    let (reader, go_tx) = stalled_reader(&vol, a, 0xA1);
    // Rewrite 4 MiB forty times: 160 MiB through a 16 MiB volume.
    for round in 0..40u8 {
        vol.write(&Cred::ROOT, b, 0, &vec![round; 4 << 20]).unwrap();
    }
    go_tx.send(()).unwrap();
    assert!(reader.join().unwrap());
    assert_fsck_clean(&vol);
}
