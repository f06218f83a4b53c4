//! Region::map_file: what backs a UMEM (no privileges needed).

mod common;

use std::os::unix::fs::FileExt;

use common::shm_file;
use zcfs_xsk::{Region, RegionError, MAX_REGION_LEN};

/// A file on a page-cache file system (the test target directory: ext4 or overlay here)
/// is refused with a typed error naming the file system and why.
#[test]
fn a_region_over_a_page_cache_file_is_refused() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("xsk-region-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f.set_len(1 << 16).unwrap();
    let err = Region::map_file(&f, 4096).unwrap_err();
    let RegionError::UnsupportedBacking { ref fs, .. } = err else {
        panic!("not refused as unsupported: {err}");
    };
    assert_ne!(
        fs, "tmpfs",
        "the target directory is on tmpfs: this test needs a disk"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(fs.as_str()) && msg.contains("long-term write pins"),
        "{msg}"
    );
}

/// A /dev/shm file's region is the file (what is written lands in the file) followed by
/// zeroed staging memory rounded up to a page.
#[test]
fn a_file_region_is_the_file_followed_by_its_staging_area() {
    let f = shm_file("map", 3 * 4096, 0x5A);
    let r = Region::map_file(&f, 100).unwrap();
    assert_eq!(r.file_len(), 3 * 4096);
    assert_eq!(r.len(), 4 * 4096);
    r.write(0, b"first").unwrap();
    r.write(3 * 4096 - 4, b"last").unwrap();
    let mut b = [0u8; 5];
    f.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"first");
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, 3 * 4096 - 4).unwrap();
    assert_eq!(&b, b"last");
    let mut staging = vec![1u8; 4096];
    r.read(3 * 4096, &mut staging).unwrap();
    assert!(staging.iter().all(|&x| x == 0));
    r.write(4 * 4096 - 1, b"s").unwrap();
    assert!(r.write(4 * 4096, b"s").is_err());
    assert_eq!(
        f.metadata().unwrap().len(),
        3 * 4096,
        "the file did not grow"
    );
    // No staging at all: the file alone.
    assert_eq!(Region::map_file(&f, 0).unwrap().len(), 3 * 4096);
}

/// A file whose length is not page-aligned cannot have staging right behind it; a region
/// beyond the 48-bit UMEM address space is refused (at the bound: MAX_REGION_LEN + 1).
#[test]
fn unaligned_files_and_oversized_regions_are_refused() {
    let f = shm_file("odd", 4097, 0);
    assert!(matches!(
        Region::map_file(&f, 0),
        Err(RegionError::Unaligned { len: 4097, .. })
    ));
    let f = shm_file("big", 4096, 0);
    let over = (MAX_REGION_LEN - 4096 + 1) as usize;
    assert!(matches!(
        Region::map_file(&f, over),
        Err(RegionError::TooLarge { .. })
    ));
    let empty = shm_file("empty", 0, 0);
    assert!(matches!(
        Region::map_file(&empty, 0),
        Err(RegionError::TooLarge { len: 0, .. })
    ));
}
