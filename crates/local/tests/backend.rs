//! LocalFs, the Backend over a volume, without root or FUSE: references keep removed
//! inodes alive until forgotten, readdir with attributes hands out references, errors
//! carry their errno, and the zero-copy read and write paths move the right bytes.

use std::sync::Arc;
use zcfs_backend::{Backend, BufPayload, Ctx, SetAttr, WritePayload, ROOT};
use zcfs_local::LocalFs;
use zcfs_volume::{MkfsOptions, Region, RootDir, Volume, VolumeConfig};

fn fs() -> LocalFs {
    LocalFs::new(volume(VolumeConfig::synchronous()))
}

/// A fresh 16 MiB volume in memory, its root owned by the tests' caller (`ctx()`).
fn volume(cfg: VolumeConfig) -> Arc<Volume> {
    let mut region = Region::anonymous(16 << 20);
    Volume::mkfs_region(
        &mut region,
        &MkfsOptions {
            inodes: Some(256),
            log_bytes: Some(256 << 10),
            // Owned by the tests' caller (`ctx()`).
            root: RootDir {
                uid: 1000,
                gid: 100,
                mode: 0o755,
            },
        },
    )
    .unwrap();
    Volume::open_region(region, cfg).unwrap()
}

fn ctx() -> Ctx {
    Ctx::user(1000, 100)
}

fn read(fs: &LocalFs, ino: u64, off: u64, len: u32) -> Vec<u8> {
    let mut out = Vec::new();
    fs.read(ino, 0, off, len, &mut |s: &[&[u8]]| {
        out = s.concat();
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn a_looked_up_inode_outlives_its_last_name_until_forgotten() {
    let fs = fs();
    let (a, fh) = fs
        .create(&ctx(), ROOT, b"f", libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap();
    assert_eq!((a.uid, a.gid), (1000, 100));
    fs.write(&ctx(), a.ino, fh, 0, b"kept").unwrap();
    fs.release(a.ino, fh).unwrap();
    // create gave one reference; a lookup another.
    let b = fs.lookup(&ctx(), ROOT, b"f").unwrap();
    assert_eq!(b.ino, a.ino);
    let gone = fs.unlink(&ctx(), ROOT, b"f").unwrap();
    assert_eq!(gone.nlink, 0);
    assert_eq!(read(&fs, a.ino, 0, 10), b"kept");
    fs.forget(a.ino, 1);
    assert_eq!(read(&fs, a.ino, 0, 10), b"kept", "one reference left");
    fs.forget(a.ino, 1);
    let e = fs.getattr(a.ino).unwrap_err();
    assert_eq!(e.errno, libc::ESTALE, "{e}");
    // A stale generation is refused by hold.
    let (c, fh) = fs
        .create(&ctx(), ROOT, b"g", libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap();
    assert_eq!(
        fs.hold(c.ino, c.generation + 1).unwrap_err().errno,
        libc::ESTALE
    );
    fs.hold(c.ino, c.generation).unwrap();
    fs.release(c.ino, fh).unwrap();
}

#[test]
fn readdir_with_attributes_hands_out_references() {
    let fs = fs();
    for n in [&b"a"[..], b"b", b"c"] {
        let (a, fh) = fs
            .create(&ctx(), ROOT, n, libc::S_IFREG | 0o644, libc::O_RDWR)
            .unwrap();
        fs.release(a.ino, fh).unwrap();
        fs.forget(a.ino, 1);
    }
    let mut taken = Vec::new();
    fs.readdir(ROOT, 0, true, &mut |e| {
        assert!(e.attr.is_some());
        taken.push(e.ino);
        true
    })
    .unwrap();
    assert_eq!(taken.len(), 3);
    // Each entry holds a reference: a removed one stays until forgotten.
    fs.unlink(&ctx(), ROOT, b"a").unwrap();
    fs.getattr(taken[0]).unwrap();
    let a = taken[0];
    for ino in &taken {
        fs.forget(*ino, 1);
    }
    assert_eq!(fs.getattr(a).unwrap_err().errno, libc::ESTALE);
}

#[test]
fn errors_carry_their_errno_and_the_zero_copy_paths_move_the_right_bytes() {
    let fs = fs();
    assert_eq!(
        fs.lookup(&ctx(), ROOT, b"missing").unwrap_err().errno,
        libc::ENOENT
    );
    assert_eq!(
        fs.mkdir(&ctx(), ROOT, &[b'x'; 256], 0o755)
            .unwrap_err()
            .errno,
        libc::ENAMETOOLONG
    );
    let d = fs.mkdir(&ctx(), ROOT, b"d", 0o755).unwrap();
    assert_eq!(
        fs.unlink(&ctx(), ROOT, b"d").unwrap_err().errno,
        libc::EISDIR
    );
    let (a, fh) = fs
        .create(&ctx(), d.ino, b"f", libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap();
    assert_eq!(
        fs.rmdir(&ctx(), ROOT, b"d").unwrap_err().errno,
        libc::ENOTEMPTY
    );
    // write_with fills the reserved blocks in place, in one call, exactly len bytes.
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let mut payload = Counted {
        inner: BufPayload(&data),
        calls: 0,
    };
    let n = fs.write_with(&ctx(), a.ino, fh, 100, &mut payload).unwrap();
    let calls = payload.calls;
    assert_eq!(payload.remaining(), 0);
    assert_eq!((n as usize, calls), (data.len(), 1));
    assert_eq!(read(&fs, a.ino, 100, 10_000), data);
    assert_eq!(read(&fs, a.ino, 0, 100), vec![0u8; 100]);
    // The reply is sent once, also at end of file (with nothing).
    let mut calls = 0;
    fs.read(a.ino, fh, 1 << 20, 10, &mut |s: &[&[u8]]| {
        calls += 1;
        assert!(s.iter().all(|x| x.is_empty()));
        Ok(())
    })
    .unwrap();
    assert_eq!(calls, 1);
    let set = SetAttr {
        size: Some(50),
        mode: Some(0o600),
        ..Default::default()
    };
    let after = fs.setattr(&ctx(), a.ino, &set, 0).unwrap();
    assert_eq!((after.size, after.mode & 0o7777), (50, 0o600));
    fs.release(a.ino, fh).unwrap();
    let stats = fs.copy_stats();
    assert!(stats.payload_bytes_written >= 10_000);
    let _ = Arc::new(fs);
}

/// A payload in memory that counts the backend's fills.
struct Counted<'a> {
    inner: BufPayload<'a>,
    calls: usize,
}

impl WritePayload for Counted<'_> {
    fn remaining(&self) -> usize {
        self.inner.remaining()
    }
    fn fill(&mut self, dst: &mut [&mut [u8]]) -> zcfs_backend::Result<()> {
        self.calls += 1;
        self.inner.fill(dst)
    }
}

/// close(2) (flush) returns only once what was written is durable, whatever the group
/// commit's batch: an image taken right after it (a power cut) still has the data.
#[test]
fn flush_makes_the_writes_durable_under_group_commit() {
    // A batch that neither fills nor times out during the test.
    let cfg = VolumeConfig {
        batch_ops: 1 << 20,
        batch_bytes: 1 << 40,
        batch_delay: std::time::Duration::from_secs(3600),
        ..Default::default()
    };
    let vol = volume(cfg);
    let fs = LocalFs::new(vol.clone());
    let (a, fh) = fs
        .create(&ctx(), ROOT, b"kept", libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap();
    fs.write(&ctx(), a.ino, fh, 0, b"closed, so durable")
        .unwrap();
    fs.flush(a.ino, fh).unwrap();
    // SAFETY: no operation runs while the image is taken.
    let image = unsafe { vol.test_door().image() };
    vol.abandon();
    let again = LocalFs::new(
        Volume::open_region(Region::from_image(&image), VolumeConfig::synchronous()).unwrap(),
    );
    let b = again.lookup(&ctx(), ROOT, b"kept").unwrap();
    assert_eq!(b.size, 18, "the write was not durable at close");
}

/// readdir reads the volume READDIR_BATCH entries at a time: every entry comes exactly
/// once, in cookie order, for directories at, just past and well past the batch, and a
/// caller that stops and goes on from the last cookie it took misses none either.
#[test]
fn readdir_in_batches_lists_each_entry_once_at_and_past_the_batch() {
    use zcfs_local::READDIR_BATCH;
    let fs = LocalFs::new({
        let mut region = Region::anonymous(64 << 20);
        Volume::mkfs_region(
            &mut region,
            &MkfsOptions {
                inodes: Some(2048),
                log_bytes: Some(1 << 20),
                root: RootDir {
                    uid: 1000,
                    gid: 100,
                    mode: 0o755,
                },
            },
        )
        .unwrap();
        Volume::open_region(region, VolumeConfig::synchronous()).unwrap()
    });
    for (d, n) in [
        ("at", READDIR_BATCH),
        ("past", READDIR_BATCH + 1),
        ("far", 3 * READDIR_BATCH + 7),
    ] {
        let dir = fs.mkdir(&ctx(), ROOT, d.as_bytes(), 0o755).unwrap();
        let mut want: Vec<Vec<u8>> = (0..n).map(|i| format!("f{i:04}").into_bytes()).collect();
        for name in &want {
            fs.mknod(&ctx(), dir.ino, name, libc::S_IFREG | 0o644, 0)
                .unwrap();
            // (mknod's reference, as the kernel's lookup would count it)
        }
        want.sort();
        let list = |from: u64, stop_after: usize| {
            let mut got = Vec::new();
            let mut last = from;
            fs.readdir(dir.ino, from, false, &mut |e| {
                if got.len() == stop_after {
                    return false;
                }
                assert!(e.next > last, "{d}: cookies go up");
                last = e.next;
                got.push((e.name, e.next));
                true
            })
            .unwrap();
            got
        };
        let mut all: Vec<Vec<u8>> = list(0, usize::MAX).into_iter().map(|(n, _)| n).collect();
        all.sort();
        assert_eq!(all, want, "{d}: every entry once");
        // Stop a few past the batch, then go on from the last cookie taken.
        let first = list(0, READDIR_BATCH + 3);
        assert_eq!(first.len(), (READDIR_BATCH + 3).min(n), "{d}");
        let rest = list(first.last().unwrap().1, usize::MAX);
        let mut both: Vec<Vec<u8>> = first.into_iter().chain(rest).map(|(n, _)| n).collect();
        both.sort();
        assert_eq!(
            both, want,
            "{d}: stopped and went on, none missed or repeated"
        );
    }
}

/// readdir fails only before it passes anything on: a later batch that cannot be read
/// (the directory gone meanwhile) ends the listing instead, as the one collection before
/// batches did. With `plus` the caller owns a reference per entry passed, and a caller
/// that drops the entries of a failed call (the FUSE frontend answers the error) would
/// leak them; the next call from the last cookie reports the error.
#[test]
fn readdir_fails_only_before_passing_anything_on() {
    use zcfs_local::READDIR_BATCH;
    let fs = fs();
    let dir = fs.mkdir(&ctx(), ROOT, b"d", 0o755).unwrap();
    let n = READDIR_BATCH + 5;
    let names: Vec<Vec<u8>> = (0..n).map(|i| format!("f{i:04}").into_bytes()).collect();
    for name in &names {
        let a = fs
            .mknod(&ctx(), dir.ino, name, libc::S_IFREG | 0o644, 0)
            .unwrap();
        fs.forget(a.ino, 1);
    }
    let mut taken = Vec::new();
    let r = fs.readdir(dir.ino, 0, true, &mut |e| {
        taken.push(e.ino);
        if taken.len() == READDIR_BATCH {
            // The directory emptied, removed and forgotten before the next batch.
            for name in &names {
                fs.unlink(&ctx(), dir.ino, name).unwrap();
            }
            fs.rmdir(&ctx(), ROOT, b"d").unwrap();
            fs.forget(dir.ino, 1);
        }
        true
    });
    assert_eq!(taken.len(), READDIR_BATCH);
    assert!(r.is_ok(), "entries passed on, then {r:?}");
    for ino in &taken {
        fs.getattr(*ino).unwrap();
        fs.forget(*ino, 1);
        assert_eq!(fs.getattr(*ino).unwrap_err().errno, libc::ESTALE);
    }
    // Going on from there reports it.
    assert_eq!(
        fs.readdir(dir.ino, 0, false, &mut |_| true)
            .unwrap_err()
            .errno,
        libc::ESTALE
    );
}
