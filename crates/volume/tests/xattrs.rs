//! Many and large xattrs per inode (issue 14): sets spanning blocks (the index form,
//! format version 4), the kernel's limits (name 255, value 65536, list 65536) and the
//! per-inode limit `XATTR_SET_MAX`, all-or-nothing failures, damaged chains as typed
//! errors that fsck reports, and crash consistency of large sets.

mod common;
use common::xattr::{all_of, blocks_of, every_crash_image_recovers_to_a_state, set};
use common::*;
use std::collections::BTreeMap;
use zcfs_pmem::crash::CrashConfig;
use zcfs_volume::*;

const R: &Cred = &Cred::ROOT;

/// Five hundred small attributes (a few hundred filled the one block before), kept
/// across a remount; half removed; the block count follows the set's size.
#[test]
fn hundreds_of_small_xattrs_are_kept_and_counted() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let mut want = BTreeMap::new();
    for i in 0..500usize {
        let name = format!("user.attr{i:04}").into_bytes();
        let value = vec![i as u8; 16 + i % 185];
        set(&vol, f, &name, &value).unwrap();
        want.insert(name, value);
    }
    let cost: usize = want
        .iter()
        .map(|(k, v)| XATTR_ENTRY_COST + k.len() + v.len())
        .sum();
    assert_eq!(blocks_of(&vol, f), 1 + cost.div_ceil(BLOCK) as u64);
    assert_eq!(all_of(&vol, f), want);
    let vol = remount(vol);
    assert_eq!(all_of(&vol, f), want);
    assert_fsck_clean(&vol);
    for i in (0..500).step_by(2) {
        let name = format!("user.attr{i:04}").into_bytes();
        vol.removexattr(R, f, &name).unwrap();
        want.remove(&name);
    }
    let vol = remount(vol);
    assert_eq!(all_of(&vol, f), want);
    assert_fsck_clean(&vol);
    // Back to one block, then none; unlink frees whatever is left.
    for k in want.keys() {
        vol.removexattr(R, f, k).unwrap();
    }
    assert_eq!(blocks_of(&vol, f), 0);
    set(&vol, f, b"user.big", &[1; 30000]).unwrap();
    let free = vol.statfs().bfree;
    vol.unlink(R, ROOT_INO, b"f").unwrap();
    vol.checkpoint_now().unwrap();
    assert_eq!(
        vol.statfs().bfree,
        free + 1 + 30000usize.div_ceil(BLOCK) as u64
    );
    assert_fsck_clean(&remount(vol));
}

/// Values: exactly `XATTR_SIZE_MAX` stores, one byte more is E2BIG. Names: exactly
/// `XATTR_NAME_MAX` stores, longer or empty is ERANGE (as the kernel answers).
#[test]
fn value_and_name_limits_are_the_kernels() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let v = pattern(0, XATTR_SIZE_MAX, 3);
    set(&vol, f, b"user.max", &v).unwrap();
    let e = set(&vol, f, b"user.over", &[0; XATTR_SIZE_MAX + 1]).unwrap_err();
    assert!(matches!(e, FsError::XattrValueTooBig(_)), "{e}");
    assert_eq!(e.errno(), libc::E2BIG);
    let mut name = b"user.".to_vec();
    name.resize(XATTR_NAME_MAX, b'n');
    set(&vol, f, &name, b"x").unwrap();
    name.push(b'n');
    assert_eq!(set(&vol, f, &name, b"x").unwrap_err().errno(), libc::ERANGE);
    assert_eq!(set(&vol, f, b"", b"x").unwrap_err().errno(), libc::ERANGE);
    let vol = remount(vol);
    assert_eq!(vol.getxattr(R, f, b"user.max").unwrap(), v);
    assert_fsck_clean(&vol);
}

/// The per-inode limit: a set costing exactly `XATTR_SET_MAX` stores; one byte more is
/// ENOSPC and leaves the set as it was, in DRAM and on PM.
#[test]
fn the_per_inode_set_limit_is_exact_and_all_or_nothing() {
    let vol = memory_volume(16 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let mut cost = 0;
    let mut i = 0;
    while XATTR_SET_MAX - cost > XATTR_ENTRY_COST + 10 + XATTR_SIZE_MAX {
        set(
            &vol,
            f,
            format!("user.v{i:04}").as_bytes(),
            &[i as u8; XATTR_SIZE_MAX],
        )
        .unwrap();
        cost += XATTR_ENTRY_COST + 10 + XATTR_SIZE_MAX;
        i += 1;
    }
    let last = XATTR_SET_MAX - cost - XATTR_ENTRY_COST - b"user.last".len();
    set(&vol, f, b"user.last", &vec![7; last]).unwrap();
    let full = all_of(&vol, f);
    let free = vol.statfs().bfree;
    assert_eq!(blocks_of(&vol, f), 1 + (XATTR_SET_MAX / BLOCK) as u64);
    // One byte more: growing a value, or a new empty attribute.
    let e = set(&vol, f, b"user.last", &vec![7; last + 1]).unwrap_err();
    assert!(matches!(e, FsError::NoSpaceXattr), "{e}");
    assert_eq!(e.errno(), libc::ENOSPC);
    assert!(matches!(
        set(&vol, f, b"user.u", b""),
        Err(FsError::NoSpaceXattr)
    ));
    assert_eq!(all_of(&vol, f), full);
    assert_eq!(vol.statfs().bfree, free);
    // Replacing a value by one of the same size still fits.
    set(&vol, f, b"user.last", &vec![8; last]).unwrap();
    let vol = remount(vol);
    let mut want = full;
    want.insert(b"user.last".to_vec(), vec![8; last]);
    assert_eq!(all_of(&vol, f), want);
    assert_fsck_clean(&vol);
}

/// listxattr answers at most `XATTR_LIST_MAX` bytes of names and NULs; longer is E2BIG
/// (the kernel's answer), never a truncated list.
#[test]
fn a_list_longer_than_xattr_list_max_is_e2big() {
    let vol = memory_volume(16 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    // 256 names of 255 bytes + NUL = 65536 exactly.
    let name = |i: usize| {
        let mut n = format!("user.{i:03}").into_bytes();
        n.resize(XATTR_NAME_MAX, b'x');
        n
    };
    for i in 0..XATTR_LIST_MAX / (XATTR_NAME_MAX + 1) {
        set(&vol, f, &name(i), b"").unwrap();
    }
    let list = vol.listxattr(R, f).unwrap();
    assert_eq!(
        list.iter().map(|n| n.len() + 1).sum::<usize>(),
        XATTR_LIST_MAX
    );
    set(&vol, f, b"user.z", b"").unwrap();
    let e = vol.listxattr(R, f).unwrap_err();
    assert!(matches!(e, FsError::XattrListTooBig(_)), "{e}");
    assert_eq!(e.errno(), libc::E2BIG);
    // Each attribute is still there to get and remove.
    assert_eq!(vol.getxattr(R, f, &name(7)).unwrap(), b"");
    vol.removexattr(R, f, b"user.z").unwrap();
    assert_eq!(vol.listxattr(R, f).unwrap().len(), list.len());
    assert_fsck_clean(&vol);
}

/// A full volume in the middle of replacing a large set with a larger one: ENOSPC, and
/// the old set, the free count and fsck are as before, also after a remount; a
/// replacement that does not grow the set works from the metadata reserve.
#[test]
fn a_full_volume_refuses_a_large_set_and_keeps_the_old_one() {
    let vol = memory_volume(2 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    for i in 0..300usize {
        set(&vol, f, format!("user.k{i:03}").as_bytes(), &[i as u8; 40]).unwrap();
    }
    let before = all_of(&vol, f);
    let filler = new_file(&vol, ROOT_INO, b"filler");
    let mut at = 0u64;
    while vol.write(R, filler, at, &[0xF0; 4096]).is_ok() {
        at += 4096;
    }
    vol.checkpoint_now().unwrap();
    let free = vol.statfs().bfree;
    assert!(free < 4, "{free} blocks left");
    // A set that grows needs blocks the volume does not have.
    let e = set(&vol, f, b"user.new", &[2; 20000]).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert_eq!(all_of(&vol, f), before);
    assert_eq!(vol.statfs().bfree, free);
    assert_fsck_clean(&vol);
    // One that does not grow is rewritten from the metadata reserve and gives its old
    // blocks back (as ext4 rewrites in place).
    set(&vol, f, b"user.k000", &[1u8; 40]).unwrap();
    vol.checkpoint_now().unwrap();
    assert_eq!(vol.statfs().bfree, free);
    set(&vol, f, b"user.k000", &[0u8; 40]).unwrap();
    assert_eq!(all_of(&vol, f), before);
    assert_fsck_clean(&vol);
    let vol = remount(vol);
    assert_eq!(all_of(&vol, f), before);
    assert_fsck_clean(&vol);
    // Room again: the same change now succeeds.
    vol.unlink(R, ROOT_INO, b"filler").unwrap();
    set(&vol, f, b"user.new", &[2; 20000]).unwrap();
    assert_eq!(
        remount(vol).getxattr(R, f, b"user.new").unwrap(),
        [2; 20000]
    );
}

/// The blocks of an image whose first 4 bytes are the index magic "ZXAI".
fn index_blocks(img: &[u8]) -> Vec<usize> {
    (0..img.len() / BLOCK)
        .filter(|b| &img[b * BLOCK..b * BLOCK + 4] == b"ZXAI")
        .collect()
}

/// An image with one file whose xattr set takes the index form, and the set.
fn image_with_an_index() -> (Vec<u8>, u64, usize) {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    set(&vol, f, b"user.a", &[5; 10000]).unwrap();
    vol.checkpoint_now().unwrap();
    let img = image_of(&vol);
    vol.abandon();
    let idx = index_blocks(&img);
    assert_eq!(idx.len(), 1, "one index block");
    (img, f, idx[0])
}

/// A damaged index or stream is a typed error: the mount refuses the volume (Corrupt,
/// never a panic), fsck names the inode and what is wrong.
#[test]
fn a_damaged_chain_is_a_typed_error_that_fsck_reports() {
    let (img, f, idx) = image_with_an_index();
    let first = u64::from_le_bytes(img[idx * BLOCK + 32..idx * BLOCK + 40].try_into().unwrap());
    // What to damage (a byte flipped) and what fsck must then say.
    let cases = [
        ("xattr index: checksum", idx * BLOCK + 33),
        ("xattr stream: checksum", first as usize * BLOCK + 100),
        ("xattr block: bad magic", idx * BLOCK),
    ];
    for (what, at) in cases {
        let mut bad = img.clone();
        bad[at] ^= 1;
        let e = Volume::open_region(Region::from_image(&bad), VolumeConfig::synchronous())
            .err()
            .unwrap_or_else(|| panic!("{what}: a damaged set mounted"));
        assert!(matches!(e, FsError::Corrupt(_)), "{what}: {e}");
        let report = fsck::fsck_image(&bad).unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains(&format!("inode {f}")) && p.contains(what)),
            "{what}: {:?}",
            report.problems
        );
    }
    // A listed block owned by another inode is reported as such.
    let vol = Volume::open_region(Region::from_image(&img), VolumeConfig::synchronous()).unwrap();
    let g = new_file(&vol, ROOT_INO, b"g");
    vol.write(R, g, 0, &[1; 4096]).unwrap();
    vol.checkpoint_now().unwrap();
    let mut img2 = image_of(&vol);
    vol.abandon();
    let data_of_g = (0..img2.len() / BLOCK)
        .find(|b| img2[b * BLOCK..(b + 1) * BLOCK].iter().all(|&x| x == 1))
        .expect("g's block");
    // Point the index's first entry at g's block, checksum recomputed.
    let at = idx * BLOCK;
    img2[at + 32..at + 40].copy_from_slice(&(data_of_g as u64).to_le_bytes());
    let n = u32::from_le_bytes(img2[at + 12..at + 16].try_into().unwrap()) as usize;
    let crc = crc32c::crc32c_append(
        crc32c::crc32c(&img2[at..at + 28]),
        &img2[at + 32..at + 32 + 8 * n],
    );
    img2[at + 28..at + 32].copy_from_slice(&crc.to_le_bytes());
    let report = fsck::fsck_image(&img2).unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("owned twice")),
        "{:?}",
        report.problems
    );
}

/// A version 3 image (xattr sets of one block) opens, its sets read, and a large set
/// can be added to it.
#[test]
fn a_version_3_image_reads_and_grows() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    set(&vol, f, b"user.old", b"value").unwrap();
    vol.sync().unwrap();
    let mut img = image_of(&vol);
    vol.abandon();
    for c in 0..2 {
        let at = c * BLOCK;
        img[at + 8..at + 12].copy_from_slice(&3u32.to_le_bytes());
        let crc = crc32c::crc32c(&img[at..at + 508]);
        img[at + 508..at + 512].copy_from_slice(&crc.to_le_bytes());
    }
    let vol = Volume::open_region(Region::from_image(&img), VolumeConfig::synchronous()).unwrap();
    assert_eq!(vol.getxattr(R, f, b"user.old").unwrap(), b"value");
    set(&vol, f, b"user.new", &[9; XATTR_SIZE_MAX]).unwrap();
    let vol = remount(vol);
    assert_eq!(
        vol.getxattr(R, f, b"user.new").unwrap(),
        [9; XATTR_SIZE_MAX]
    );
    assert_fsck_clean(&vol);
}

/// Crash enumeration over large-set changes: at every fence each image a power
/// failure could leave recovers to the set before or after the change in progress.
#[test]
fn large_set_changes_are_crash_consistent() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    set(&vol, f, b"user.small", b"1").unwrap();
    vol.checkpoint_now().unwrap();
    // Each change is one operation (one transaction).
    type Change = Box<dyn Fn(&Volume)>;
    let mut changes: Vec<Change> = vec![
        // Single -> index form, a 64 KiB value.
        Box::new(move |v: &Volume| set(v, f, b"user.big", &[3; XATTR_SIZE_MAX]).unwrap()),
    ];
    // Index -> index.
    for i in 0..2u8 {
        changes.push(Box::new(move |v: &Volume| {
            set(v, f, format!("user.s{i}").as_bytes(), &[i; 1500]).unwrap()
        }));
    }
    // Index -> single form -> none.
    for n in ["user.big", "user.s0", "user.s1", "user.small"] {
        changes.push(Box::new(move |v: &Volume| {
            v.removexattr(R, f, n.as_bytes()).unwrap()
        }));
    }
    let mut states = vec![all_of(&vol, f)];
    // SAFETY: this thread alone uses the volume while recording.
    unsafe { vol.test_door().start_recording() };
    for (i, c) in changes.iter().enumerate() {
        vol.test_door().mark(i as u64);
        c(&vol);
        states.push(all_of(&vol, f));
    }
    let rec = vol.test_door().take_recording().unwrap();
    vol.abandon();
    let cfg = CrashConfig {
        pair_limit: 12,
        sampled_pairs: 48,
        random_subsets: 6,
        seed: 0x7a77,
    };
    // A synchronous volume: at most the change under way is lost.
    every_crash_image_recovers_to_a_state(
        "large xattr sets",
        &rec,
        &cfg,
        &states,
        |started| started.saturating_sub(1)..=started,
        |v| all_of(v, f),
    );
}
