//! fallocate keeps its promise (issue 14): preallocated blocks and the copy-on-write
//! reserve of their first overwrite, ENOSPC up front at the exact bound, the reserve
//! across remounts, truncate and unlink, and SEEK_DATA/SEEK_HOLE from the map.

mod common;
use common::*;
use zcfs_volume::*;

const B: u64 = BLOCK as u64;
const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;

fn falloc(vol: &Volume, ino: u64, off: u64, len: u64, mode: i32) -> Result<()> {
    vol.fallocate(&Cred::ROOT, ino, off, len, FallocMode::from_bits(mode)?)
}

fn bfree(vol: &Volume) -> u64 {
    vol.statfs().bfree
}

/// The bound: preallocating h blocks in an empty file takes h blocks, one map node
/// (h ≤ 512) and h more held back; one block fewer free than that is ENOSPC before
/// anything changes.
#[test]
fn enospc_up_front_at_the_exact_bound() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let free = bfree(&vol);
    assert!(
        free < 1025,
        "the test needs fewer than 512 preallocatable blocks"
    );
    let h = (free - 1) / 2; // 2h + 1 ≤ free
    let too_many = h + 1; // 2(h+1) + 1 > free
    let before = dump_volume(&vol).unwrap();
    assert!(matches!(
        falloc(&vol, f, 0, too_many * B, 0),
        Err(FsError::NoSpace)
    ));
    assert_eq!(
        dump_volume(&vol).unwrap(),
        before,
        "a refused fallocate changed the tree"
    );
    assert_eq!(
        bfree(&vol),
        free,
        "a refused fallocate changed the free count"
    );
    assert_eq!(vol.getattr(f).unwrap().size, 0);
    falloc(&vol, f, 0, h * B, 0).unwrap();
    let a = vol.getattr(f).unwrap();
    assert_eq!(a.size, h * B);
    assert_eq!(
        a.blocks,
        (h + 1) * (B / 512),
        "h data blocks and one map node"
    );
    assert_eq!(bfree(&vol), free - 2 * h - 1, "the reserve counts as used");
    assert_fsck_clean(&vol);
}

/// After fallocate, fill the volume with another file to ENOSPC: every block of the
/// preallocated range can still be overwritten (copy-on-write) once.
#[test]
fn overwrites_of_preallocated_blocks_never_fail_for_space() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"pre");
    let g = new_file(&vol, ROOT_INO, b"filler");
    let h = 200u64;
    falloc(&vol, f, 0, h * B, KEEP).unwrap();
    assert_eq!(vol.getattr(f).unwrap().size, 0, "KEEP_SIZE");
    // Fill the rest.
    let chunk = vec![7u8; BLOCK * 16];
    let mut off = 0;
    loop {
        match vol.write(&Cred::ROOT, g, off, &chunk) {
            Ok(n) => off += n as u64,
            Err(FsError::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(off < 64 << 20, "the filler never ran out");
    }
    assert_eq!(bfree(&vol), 0);
    // The promise: writes into the range, in pieces of various sizes.
    let mut at = 0;
    for (k, n) in [1u64, 3, 16, 80, 100].iter().enumerate() {
        let data = pattern(at * B, (*n * B) as usize, k as u8);
        assert_eq!(
            vol.write(&Cred::ROOT, f, at * B, &data).unwrap(),
            data.len(),
            "overwrite {k} of preallocated blocks"
        );
        at += n;
    }
    assert_eq!(at, h);
    let mut back = vec![0u8; (h * B) as usize];
    vol.read(f, 0, &mut back).unwrap();
    assert_eq!(&back[..BLOCK], &pattern(0, BLOCK, 0)[..]);
    assert_fsck_clean(&vol);
    let vol = remount(vol);
    assert_fsck_clean(&vol);
}

/// The reserve is in the inode record: it survives a remount; truncate lowers it
/// (never above the file's data blocks) and unlink releases it.
#[test]
fn the_reserve_persists_and_follows_the_blocks() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let free0 = bfree(&vol);
    falloc(&vol, f, 0, 100 * B, 0).unwrap();
    let after = bfree(&vol);
    assert_eq!(after, free0 - 201);
    let vol = remount(vol);
    assert_eq!(bfree(&vol), after, "the reserve was lost at remount");
    // One overwrite spends one block of reserve, and frees the old block.
    vol.write(&Cred::ROOT, f, 0, &[1u8; 4096]).unwrap();
    vol.sync().unwrap();
    assert_eq!(bfree(&vol), after + 1);
    let vol = remount(vol);
    assert_eq!(bfree(&vol), after + 1);
    // Truncate to 10 blocks: 90 data blocks go, and the reserve (99) falls to the
    // file's 10 data blocks.
    vol.truncate(&Cred::ROOT, f, 10 * B).unwrap();
    vol.sync().unwrap();
    assert_eq!(bfree(&vol), free0 - (10 + 1 + 10));
    assert_fsck_clean(&vol);
    vol.unlink(&Cred::ROOT, ROOT_INO, b"f").unwrap();
    vol.sync().unwrap();
    assert_eq!(bfree(&vol), free0);
    let vol = remount(vol);
    assert_eq!(bfree(&vol), free0);
    assert_fsck_clean(&vol);
}

/// ZERO_RANGE: the range reads zeros and is allocated; the bytes around it stay.
#[test]
fn zero_range_keeps_the_bytes_around_it() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let data = pattern(0, 5 * BLOCK, 3);
    vol.write(&Cred::ROOT, f, 0, &data).unwrap();
    falloc(&vol, f, 100, 3 * B, libc::FALLOC_FL_ZERO_RANGE | KEEP).unwrap();
    let mut want = data.clone();
    want[100..100 + 3 * BLOCK].fill(0);
    let mut got = vec![0u8; 5 * BLOCK];
    vol.read(f, 0, &mut got).unwrap();
    assert_eq!(got, want);
    falloc(&vol, f, 4 * B, 4 * B, libc::FALLOC_FL_ZERO_RANGE).unwrap();
    assert_eq!(vol.getattr(f).unwrap().size, 8 * B);
    want.resize(8 * BLOCK, 0);
    want[4 * BLOCK..].fill(0);
    let mut got = vec![0u8; 8 * BLOCK];
    vol.read(f, 0, &mut got).unwrap();
    assert_eq!(got, want);
    assert!(matches!(
        falloc(&vol, f, 0, B, libc::FALLOC_FL_COLLAPSE_RANGE),
        Err(FsError::Unsupported(_))
    ));
    assert!(matches!(falloc(&vol, f, 0, 0, 0), Err(FsError::Invalid(_))));
    assert!(matches!(
        falloc(&vol, f, max_file_size(), 1, 0),
        Err(FsError::TooBig)
    ));
    assert_fsck_clean(&vol);
}

#[test]
fn seek_data_and_hole_follow_the_map() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let seek = |off, w| vol.seek(f, off, w).map_err(|e| e.errno());
    assert_eq!(seek(0, Seek::Data), Err(libc::ENXIO), "empty file");
    // data at blocks 2..4 and 600, size 601 blocks + 10 bytes.
    vol.write(&Cred::ROOT, f, 2 * B, &[1u8; 2 * BLOCK]).unwrap();
    vol.write(&Cred::ROOT, f, 600 * B, &[1u8; BLOCK + 10])
        .unwrap();
    let size = 601 * B + 10;
    assert_eq!(seek(0, Seek::Data), Ok(2 * B));
    assert_eq!(seek(2 * B + 5, Seek::Data), Ok(2 * B + 5));
    assert_eq!(seek(4 * B, Seek::Data), Ok(600 * B));
    assert_eq!(seek(0, Seek::Hole), Ok(0));
    assert_eq!(seek(2 * B, Seek::Hole), Ok(4 * B));
    assert_eq!(seek(600 * B, Seek::Hole), Ok(size), "the end is a hole");
    assert_eq!(seek(size, Seek::Data), Err(libc::ENXIO));
    assert_eq!(seek(size, Seek::Hole), Err(libc::ENXIO));
    // Preallocated blocks are data here (the map does not tell them apart).
    falloc(&vol, f, 10 * B, 2 * B, 0).unwrap();
    assert_eq!(seek(4 * B, Seek::Data), Ok(10 * B));
    assert_eq!(seek(10 * B, Seek::Hole), Ok(12 * B));
}
