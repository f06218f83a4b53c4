//! review14: adversarial tests of fallocate's copy-on-write reserve (issue 14) and the
//! version 2 -> 3 format upgrade. Each test states the defect it shows.

mod common;
use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use zcfs_volume::*;

const B: u64 = BLOCK as u64;

/// Largest single heap allocation these tests allow. A volume operation that needs
/// more than this for a request on a few-MiB volume is working per requested block
/// rather than per existing block; refusing it (null -> the runtime aborts with
/// "memory allocation of N bytes failed") keeps such a test from taking the shared
/// machine's memory.
const MAX_ONE_ALLOCATION: usize = 256 << 20;

struct Capped;

// SAFETY: forwards to the system allocator; only refuses (null) some requests,
// which GlobalAlloc allows.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > MAX_ONE_ALLOCATION {
            refused();
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > MAX_ONE_ALLOCATION {
            refused();
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(p, l, new) }
    }
}

fn refused() {
    let m = b"review14: refused a heap allocation over MAX_ONE_ALLOCATION (256 MiB)\n";
    // SAFETY: writing a static buffer to stderr; no allocation.
    unsafe { libc::write(2, m.as_ptr().cast(), m.len()) };
}

#[global_allocator]
static CAPPED: Capped = Capped;

fn falloc(vol: &Volume, ino: u64, off: u64, len: u64, mode: i32) -> Result<()> {
    vol.fallocate(&Cred::ROOT, ino, off, len, FallocMode::from_bits(mode)?)
}

fn bfree(vol: &Volume) -> u64 {
    vol.statfs().bfree
}

fn fsck_problems(vol: &Volume) -> Vec<String> {
    zcfs_volume::fsck::check_volume(vol).problems
}

/// FINDING (high): fallocate walks and lists every block of the requested range
/// (`for_range` + the `holes` Vec in falloc.rs) under the volume's write lock before
/// its ENOSPC check. A 1 TiB KEEP_SIZE request on a 4 MiB volume (any user with a
/// writable file: `fallocate -k -l 1T f` through FUSE, or a remote client) builds a
/// list of 2^28 entries (~6 GiB) before answering ENOSPC; a larger one (up to
/// i64::MAX bytes is accepted) holds the lock for ever or kills the server by OOM.
/// Expected: ENOSPC from the holes' count (map-sized work), nothing changed.
/// Fails: the process aborts on the refused allocation of the holes list.
#[test]
fn huge_fallocate_is_refused_without_walking_every_requested_block() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let free = bfree(&vol);
    let r = falloc(&vol, f, 0, 1 << 40, libc::FALLOC_FL_KEEP_SIZE);
    assert!(matches!(r, Err(FsError::NoSpace)), "{r:?}");
    assert_eq!(bfree(&vol), free);
    assert!(fsck_problems(&vol).is_empty());
}

/// FINDING (medium): a truncate while a write reservation holds blocks drawn from the
/// file's reserve keeps the reserve at the drawn amount (`clamp_reserve`:
/// `.max(drawn)`), and writes that value into the inode record. When the reservation
/// then ends without replacing anything (dropped, e.g. a remote write whose payload
/// never arrived, or committed into what are now holes), `end_draw` gives the drawn
/// blocks back to the file's reserve: a file with no data blocks keeps blocks
/// promised for ever (statfs short of them, across remounts), and fsck reports
/// "copy-on-write reserve 4 exceeds its 0 data blocks".
#[test]
fn truncate_during_a_drawing_write_leaks_the_reserve() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let free0 = bfree(&vol);
    falloc(&vol, f, 0, 4 * B, 0).unwrap();
    let r = vol.reserve_write(&Cred::ROOT, f, 0, 4 * BLOCK).unwrap();
    vol.truncate(&Cred::ROOT, f, 0).unwrap();
    drop(r); // the write never commits
    assert_eq!(vol.getattr(f).unwrap().size, 0);
    let p = fsck_problems(&vol);
    assert!(p.is_empty(), "fsck: {p:?}");
    assert_eq!(
        bfree(&vol),
        free0,
        "an empty file still holds blocks back from statfs"
    );
    let vol = remount(vol);
    assert_eq!(bfree(&vol), free0, "the leaked reserve survives a remount");
}

/// Same leak through hole punching (FALLOC_FL_PUNCH_HOLE = `pfree`) instead of
/// truncate: the punched blocks' reserve stays with the file.
#[test]
fn punch_during_a_drawing_write_leaks_the_reserve() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    // What the same punch gives back with no write in flight: the data blocks, their
    // reserve and the emptied map node.
    let g = new_file(&vol, ROOT_INO, b"g");
    falloc(&vol, g, 0, 4 * B, 0).unwrap();
    let before = bfree(&vol);
    vol.pfree(&Cred::ROOT, g, 0, 4 * B).unwrap();
    let undisturbed = bfree(&vol) - before;
    assert!(undisturbed >= 8, "{undisturbed}");
    let f = new_file(&vol, ROOT_INO, b"f");
    falloc(&vol, f, 0, 4 * B, 0).unwrap();
    let free_before_punch = bfree(&vol);
    let r = vol.reserve_write(&Cred::ROOT, f, 0, 4 * BLOCK).unwrap();
    vol.pfree(&Cred::ROOT, f, 0, 4 * B).unwrap();
    drop(r);
    let p = fsck_problems(&vol);
    assert!(p.is_empty(), "fsck: {p:?}");
    assert_eq!(bfree(&vol), free_before_punch + undisturbed);
    let vol = remount(vol);
    assert_eq!(
        bfree(&vol),
        free_before_punch + undisturbed,
        "after a remount"
    );
}

/// Set a superblock copy's version field (docs/format.md: bytes 8..12) and its CRC
/// (the last 4 bytes of the 512-byte copy, over everything before).
fn set_sb_version(img: &mut [u8], copy: usize, v: u32) {
    let at = copy * BLOCK;
    img[at + 8..at + 12].copy_from_slice(&v.to_le_bytes());
    let crc = crc32c::crc32c(&img[at..at + 508]);
    img[at + 508..at + 512].copy_from_slice(&crc.to_le_bytes());
}

fn sb_version(img: &[u8], copy: usize) -> u32 {
    let at = copy * BLOCK;
    u32::from_le_bytes(img[at + 8..at + 12].try_into().unwrap())
}

/// FINDING (low): layout/mod.rs promises a version 2 image's "superblock is rewritten
/// as version 3 at the first read-write open, after which older builds refuse it by
/// version". The open writes only the copy not last written; the other stays a valid
/// version 2 superblock until the clean close. If the process dies in between (kill
/// -9, crash), a version 2 build finds one copy it cannot read (version 3: "unusable",
/// a warning) and opens the volume from the stale version 2 copy, dropping the
/// preallocation reserves it does not know about.
#[test]
fn a_read_write_open_of_a_version_2_image_leaves_no_version_2_superblock() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    new_file(&vol, ROOT_INO, b"f");
    vol.sync().unwrap();
    let mut img = image_of(&vol);
    vol.abandon();
    drop(vol);
    for c in 0..2 {
        set_sb_version(&mut img, c, 2);
    }
    let vol = Volume::open_region(Region::from_image(&img), VolumeConfig::synchronous())
        .expect("a version 2 image opens");
    let now = image_of(&vol);
    let versions = [sb_version(&now, 0), sb_version(&now, 1)];
    vol.abandon(); // the process dies before a clean close
    assert_eq!(
        versions,
        [zcfs_volume::layout::VERSION; 2],
        "a version 2 build can still open the volume from the other copy"
    );
}
