//! Adversarial review of the issue-8 change (branch review-volume). Each test names a
//! defect the review found; it fails (or panics / hangs, bounded) on the change as
//! committed. Run: `cargo test -p zcfs-volume --release --test review`.

mod common;
use common::*;
use std::sync::Arc;
use std::time::Duration;
use zcfs_volume::fsck::{check_volume, fsck_region};
use zcfs_volume::layout::*;
use zcfs_volume::*;

const O: Owner = Owner { uid: 0, gid: 0 };

fn problems(vol: &Volume) -> Vec<String> {
    check_volume(vol).problems
}

fn remount(vol: &Arc<Volume>) -> Result<Arc<Volume>> {
    let img = image_of(vol);
    vol.abandon();
    Volume::open_region(Region::from_image(&img), VolumeConfig::synchronous())
}

/// Run `f` on a thread; fail the test if it does not finish within `secs`.
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(_) => panic!("{what}: did not finish within {secs} s (hang)"),
    }
}

// ---------------------------------------------------------------------------------------
// Directory index after a remount (pre-existing; names.rs add_dirent / recovery.rs)
// ---------------------------------------------------------------------------------------

/// After a remount, a directory's DRAM index only knows the blocks up to the last one
/// holding an entry (`Dir::used` grows lazily in `Dir::insert`), while the directory's
/// map still holds its trailing, emptied blocks. The next entry that needs a new block
/// is put at `dir.blocks()`, i.e. *over* an existing mapped block: the old block is
/// dropped from the map without being released (leaked), and the directory's size is
/// set to that block + 1 while later blocks stay mapped past it. The next mount then
/// refuses the volume ("directory size does not match its blocks").
#[test]
fn directory_with_emptied_trailing_blocks_is_corrupted_after_remount() {
    let vol = memory_volume(16 << 20, VolumeConfig::synchronous());
    let d = vol.mkdir(ROOT_INO, b"d", 0o755, O).unwrap().ino;
    let f = vol.create(ROOT_INO, b"f", 0o644, O, 0).unwrap().ino;
    // 3 blocks of one-unit entries (128 per block), as hard links (no inodes needed).
    for i in 0..3 * 128 {
        vol.link(f, d, format!("n{i:04}").as_bytes()).unwrap();
    }
    assert_eq!(vol.getattr(d).unwrap().size, 3 * 4096);
    // Empty blocks 1 and 2.
    for i in 128..3 * 128 {
        vol.unlink(d, format!("n{i:04}").as_bytes()).unwrap();
    }
    assert!(problems(&vol).is_empty());
    let vol = remount(&vol).unwrap();
    // Block 0 is full: this entry needs a block.
    vol.link(f, d, b"new").unwrap();
    let mut errs = Vec::new();
    let size = vol.getattr(d).unwrap().size;
    if size != 3 * 4096 {
        errs.push(format!("directory size {size} < its 3 mapped blocks"));
    }
    let p = problems(&vol);
    if !p.is_empty() {
        errs.push(format!("fsck after one new entry: {p:?}"));
    }
    if let Err(e) = remount(&vol) {
        errs.push(format!("the volume no longer mounts: {e}"));
    }
    assert!(errs.is_empty(), "{errs:#?}");
}
