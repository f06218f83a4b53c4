//! Review of prefault (issue 11): the thread that backs pages ahead of the allocator
//! must never touch a mapping that is gone, nor change what the volume holds.

mod common;
use common::*;
use zcfs_volume::*;

/// Guard: a volume opened, prefaulted from the background, written and closed at once,
/// twenty times over (the thread is then mid-step or about to start): no access after
/// the unmap (the process would die of SIGSEGV), and every file written is there with
/// its bytes, fsck clean.
#[test]
fn closing_a_volume_while_it_is_prefaulted_is_safe_and_changes_nothing() {
    const ROUNDS: u32 = 20;
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/zcfs-review-wb-prefault-{}.img",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    Volume::mkfs(&path, 512 << 20, &MkfsOptions::default()).unwrap();
    allocate_whole(&path); // Else no prefault thread runs.
    for round in 0..ROUNDS {
        let vol = Volume::open(&path, VolumeConfig::default()).unwrap();
        vol.prefault_in_background();
        let name = format!("f{round}");
        let f = vol
            .create(&Cred::ROOT, ROOT_INO, name.as_bytes(), 0o644, 0)
            .unwrap();
        let data = vec![round as u8 + 1; 3 << 20];
        assert_eq!(vol.write(&Cred::ROOT, f.ino, 0, &data).unwrap(), data.len());
        drop(vol);
    }
    let vol = Volume::open(&path, VolumeConfig::default()).unwrap();
    for round in 0..ROUNDS {
        let a = vol
            .lookup(&Cred::ROOT, ROOT_INO, format!("f{round}").as_bytes())
            .unwrap();
        let got = vol.read_with(a.ino, 0, 3 << 20, |s| s.concat()).unwrap();
        assert!(got == vec![round as u8 + 1; 3 << 20], "f{round}");
    }
    assert_fsck_clean(&vol);
    drop(vol);
    std::fs::remove_file(&path).unwrap();
}

/// The prefault thread runs only where populating costs page tables alone: on an image
/// with holes it takes no memory (the file's allocated blocks do not grow); on an
/// allocated one the pages ahead of the allocator get mapped.
#[test]
fn prefault_leaves_a_sparse_image_sparse() {
    use std::os::unix::fs::MetadataExt;
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/zcfs-review-wb-sparse-{}.img",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    Volume::mkfs(&path, 512 << 20, &MkfsOptions::default()).unwrap();
    let before = std::fs::metadata(&path).unwrap().blocks();
    let vol = Volume::open(&path, VolumeConfig::default()).unwrap();
    vol.prefault_in_background();
    std::thread::sleep(std::time::Duration::from_millis(300));
    eprintln!(
        "blocks before {before} after {}",
        std::fs::metadata(&path).unwrap().blocks()
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().blocks(),
        before,
        "holes got memory"
    );
    drop(vol);
    std::fs::remove_file(&path).unwrap();
}
