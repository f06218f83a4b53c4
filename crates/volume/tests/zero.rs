//! Free blocks known to hold zeros (zero.rs): pages handed out by `reserve_pages` are
//! zero wherever their holder does not write, whether they come from a hole of the
//! image (not zeroed again), from blocks zeroed while free, or from a deleted file's
//! blocks; after a crash too.

mod common;
use common::*;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use zcfs_volume::*;

/// A volume image in /dev/shm, removed on drop.
struct Image(PathBuf);

impl Image {
    fn new(tag: &str) -> Image {
        let p = PathBuf::from(format!(
            "/dev/shm/zcfs-test-zero-{tag}-{}.img",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        Volume::mkfs(&p, 16 << 20, &small_mkfs()).unwrap();
        Image(p)
    }
    fn open(&self) -> Arc<Volume> {
        Volume::open(&self.0, VolumeConfig::synchronous()).unwrap()
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Reservations taken by a test, every page checked zero as it comes out.
struct Taken<'v> {
    vol: &'v Arc<Volume>,
    held: Vec<PageBuf<'v>>,
    offsets: HashSet<u64>,
}

impl<'v> Taken<'v> {
    fn new(vol: &'v Arc<Volume>) -> Taken<'v> {
        Taken {
            vol,
            held: Vec::new(),
            offsets: HashSet::new(),
        }
    }

    /// Reserve `n` pages (false on NoSpace); each must read zero.
    fn take(&mut self, n: usize) -> bool {
        let p = match self.vol.reserve_pages_owned(n) {
            Ok(p) => p,
            Err(FsError::NoSpace) => return false,
            Err(e) => panic!("reserve: {e}"),
        };
        let offs = p.image_offsets();
        let mut buf = p.into_page_buf(self.vol).unwrap();
        for (i, o) in offs.iter().enumerate() {
            assert!(
                buf.page_mut(i).iter().all(|&b| b == 0),
                "reserved page at image offset {o} is not zero"
            );
            assert!(self.offsets.insert(*o), "page {o} handed out twice");
        }
        self.held.push(buf);
        true
    }

    /// Take every block known clean (they come first and alone while enough are).
    fn take_clean(&mut self) {
        for _ in 0..100_000 {
            let c = self.vol.clean_blocks();
            if c == 0 || !self.take(c.min(64) as usize) {
                return;
            }
        }
        panic!("clean blocks never ran out");
    }

    /// Take blocks 64 at a time until the volume has none to give.
    fn take_all(&mut self) {
        for _ in 0..100_000 {
            if !self.take(64) {
                return;
            }
        }
        panic!("the volume never ran out of blocks");
    }
}

/// A file of `len` bytes of `byte`, deleted, its blocks freed; returns their image
/// offsets.
fn deleted_file(vol: &Arc<Volume>, len: usize, byte: u8) -> HashSet<u64> {
    let a = new_file(vol, ROOT_INO, b"a");
    vol.write(&Cred::ROOT, a, 0, &vec![byte; len]).unwrap();
    vol.sync().unwrap();
    let lease = vol.lease(a, 0, len).unwrap();
    let mut old = HashSet::new();
    for e in lease.extents() {
        assert!(!e.hole);
        for k in 0..e.len / 4096 {
            old.insert(e.image_offset + k * 4096);
        }
    }
    drop(lease);
    vol.unlink(&Cred::ROOT, ROOT_INO, b"a").unwrap();
    vol.checkpoint_now().unwrap();
    assert_eq!(old.len(), len / 4096);
    old
}

#[test]
fn pages_from_a_fresh_image_are_zero_and_not_zeroed_again() {
    let img = Image::new("fresh");
    let vol = img.open();
    let before = vol.stats.snapshot();
    let mut t = Taken::new(&vol);
    assert!(t.take(64));
    let after = vol.stats.snapshot();
    assert_eq!(
        after.reserve_zeroed_blocks - before.reserve_zeroed_blocks,
        0
    );
    assert_eq!(after.reserve_clean_blocks - before.reserve_clean_blocks, 64);
}

/// A deleted file's blocks come back through a reservation zeroed, and a page
/// committed partly written shows zeros, not the deleted bytes, where it was not
/// written.
#[test]
fn a_reused_block_never_shows_a_deleted_files_bytes() {
    let img = Image::new("reuse");
    let vol = img.open();
    let old = deleted_file(&vol, 8 << 20, 0xaa);
    let before = vol.stats.snapshot();
    {
        // The image's holes first, then the deleted file's blocks: all zero.
        let mut t = Taken::new(&vol);
        t.take_clean();
        t.take_all();
        let reused = old.intersection(&t.offsets).count();
        assert!(
            reused * 2 > old.len(),
            "most of the deleted file's {} blocks came out again ({reused})",
            old.len()
        );
        let after = vol.stats.snapshot();
        assert!(
            after.reserve_zeroed_blocks - before.reserve_zeroed_blocks >= reused as u64,
            "the deleted file's blocks were zeroed on the way out"
        );
    }
    // Given back (unknown again): one of them, committed with only its first 100
    // bytes written, reads zero past them.
    let b = new_file(&vol, ROOT_INO, b"b");
    let mut skipped = Vec::new();
    for _ in 0..10_000 {
        let p = vol
            .reserve_pages_owned(1)
            .expect("a deleted block comes out");
        if !old.contains(&p.image_offsets()[0]) {
            skipped.push(p);
            continue;
        }
        let mut buf = p.into_page_buf(&vol).unwrap();
        buf.page_mut(0)[..100].fill(0x11);
        let mut t = PflushTxn::default();
        t.pflush_add(b, 0, buf, Some(4096)).unwrap();
        vol.pflush_commit(t).unwrap();
        let mut got = vec![0xffu8; 4096];
        assert_eq!(vol.read(b, 0, &mut got).unwrap(), 4096);
        assert!(got[..100].iter().all(|&x| x == 0x11));
        assert!(
            got[100..].iter().all(|&x| x == 0),
            "unwritten bytes of a reused block must read zero"
        );
        drop(skipped);
        assert_fsck_clean(&vol);
        return;
    }
    panic!("no block of the deleted file came out");
}

/// Blocks zeroed while free are handed out without zeroing again, and read zero.
#[test]
fn blocks_zeroed_while_free_are_not_zeroed_again() {
    let img = Image::new("clean");
    let vol = img.open();
    let old = deleted_file(&vol, 8 << 20, 0x5a);
    // Take the image's holes, so only dirty blocks are left free.
    let mut t = Taken::new(&vol);
    t.take_clean();
    assert_eq!(vol.clean_blocks(), 0);
    let z0 = vol.stats.snapshot();
    let mut steps = 0;
    while vol.clean_free_blocks(16).unwrap() > 0 {
        steps += 1;
        assert!(steps < 10_000, "cleaning ends");
    }
    let z1 = vol.stats.snapshot();
    assert!(z1.background_zeroed_blocks - z0.background_zeroed_blocks >= old.len() as u64);
    // Now the deleted file's blocks come out clean: zero, and not zeroed again.
    let before = t.offsets.clone();
    t.take_clean();
    let seen = t
        .offsets
        .difference(&before)
        .filter(|o| old.contains(o))
        .count();
    assert!(
        seen * 2 > old.len(),
        "the deleted file's blocks came out clean ({seen})"
    );
    let z2 = vol.stats.snapshot();
    assert_eq!(z2.reserve_zeroed_blocks, z1.reserve_zeroed_blocks);
}

/// After a crash, free blocks that were written (a reservation filled and never
/// committed) are not taken for zero: the allocator knows nothing of the last run, and
/// the image's holes do not include them.
#[test]
fn after_a_crash_written_free_blocks_are_zeroed_when_reserved() {
    let img = Image::new("crash");
    let vol = img.open();
    let n = 2048;
    let p = vol.reserve_pages_owned(n).unwrap();
    let written: HashSet<u64> = p.image_offsets().into_iter().collect();
    let mut buf = p.into_page_buf(&vol).unwrap();
    for i in 0..n {
        buf.page_mut(i).fill(0xbb);
    }
    // Crash with the pages filled and never committed.
    std::mem::forget(buf);
    vol.abandon();
    drop(vol);
    let vol = img.open();
    let before = vol.stats.snapshot();
    let mut t = Taken::new(&vol);
    t.take_clean();
    assert!(
        written.is_disjoint(&t.offsets),
        "no written block was taken for clean"
    );
    t.take_all();
    let again = written.intersection(&t.offsets).count();
    assert!(
        again * 2 > n,
        "most written blocks came out again ({again})"
    );
    let after = vol.stats.snapshot();
    assert!(after.reserve_zeroed_blocks - before.reserve_zeroed_blocks >= again as u64);
    drop(t);
    assert_fsck_clean(&vol);
}

/// Cleaning stops at `CLEAN_TARGET` clean blocks (an anonymous volume has no holes:
/// every free block starts unknown), and one call zeroes at most what it is asked.
#[test]
fn cleaning_stops_at_its_target() {
    let vol = memory_volume(64 << 20, VolumeConfig::synchronous());
    assert_eq!(vol.clean_blocks(), 0, "no holes in anonymous memory");
    assert!(vol.statfs().bfree > CLEAN_TARGET + 100);
    assert_eq!(vol.clean_free_blocks(7).unwrap(), 7);
    let mut steps = 0;
    while vol.clean_free_blocks(64).unwrap() > 0 {
        steps += 1;
        assert!(steps < 100);
    }
    let left = (CLEAN_TARGET - vol.clean_blocks()) as usize;
    assert!(left < 64, "whole steps until less than one is missing");
    assert_eq!(vol.clean_free_blocks(left).unwrap(), left);
    assert_eq!(vol.clean_blocks(), CLEAN_TARGET);
    assert_eq!(vol.clean_free_blocks(1).unwrap(), 0, "at the target");
    // Taking some lets it make up the difference, a whole step at a time, no more.
    drop(vol.reserve_pages(10).unwrap());
    assert_eq!(vol.clean_blocks(), CLEAN_TARGET - 10);
    assert_eq!(
        vol.clean_free_blocks(11).unwrap(),
        0,
        "less than a step missing"
    );
    assert_eq!(vol.clean_free_blocks(10).unwrap(), 10);
    assert_eq!(vol.clean_free_blocks(1).unwrap(), 0);
    assert_eq!(vol.clean_blocks(), CLEAN_TARGET);
}
