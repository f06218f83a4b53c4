//! Adversarial review of multi-block xattr sets (issue 14): block accounting across
//! form changes, orphan and rename reclaim of large sets, damaged indexes pointing
//! outside the data area, and behaviour on a full volume.

mod common;
use common::xattr::{all_of, blocks_of, every_crash_image_recovers_to_a_state, set};
use common::*;
use std::collections::BTreeMap;
use zcfs_volume::*;

const R: &Cred = &Cred::ROOT;

/// Free blocks once every deferred free is reusable.
fn settled_free(vol: &Volume) -> u64 {
    vol.checkpoint_now().unwrap();
    vol.statfs().bfree
}

/// A set that shrinks from the index form to one block, to none and back, many times:
/// the inode's block count always matches its set, nothing leaks (statfs after a
/// checkpoint and after a remount), fsck stays clean.
#[test]
fn replacing_a_set_between_forms_leaks_no_block() {
    let vol = memory_volume(16 << 20, VolumeConfig::default());
    let _keep = new_file(&vol, ROOT_INO, b"keep");
    let f = new_file(&vol, ROOT_INO, b"f");
    let base = settled_free(&vol);
    let sizes = [0usize, 10, 5000, 65536, 100, 20000, 0, 4000, 65536, 1];
    let mut want = BTreeMap::new();
    for round in 0..60usize {
        let n = sizes[round % sizes.len()];
        let name = format!("user.k{}", round % 7).into_bytes();
        if n == 0 {
            if want.remove(&name).is_some() {
                vol.removexattr(R, f, &name).unwrap();
            }
        } else {
            let v = vec![round as u8; n];
            set(&vol, f, &name, &v).unwrap();
            want.insert(name, v);
        }
        let cost: usize = want
            .iter()
            .map(|(k, v)| XATTR_ENTRY_COST + k.len() + v.len())
            .sum();
        let expect = match cost {
            0 => 0,
            _ if want.values().map(|v| v.len() + 4).sum::<usize>()
                + want.keys().map(|k| k.len()).sum::<usize>()
                + 16
                <= BLOCK =>
            {
                1
            }
            c => 1 + c.div_ceil(BLOCK) as u64,
        };
        assert_eq!(blocks_of(&vol, f), expect, "round {round}");
        if round % 9 == 0 {
            assert_eq!(settled_free(&vol), base - expect, "round {round}");
        }
    }
    assert_eq!(all_of(&vol, f), want);
    let used = blocks_of(&vol, f);
    assert_eq!(settled_free(&vol), base - used);
    assert_fsck_clean(&vol);
    let vol = remount(vol);
    assert_eq!(all_of(&vol, f), want);
    assert_eq!(settled_free(&vol), base - used);
    assert_fsck_clean(&vol);
}

/// A file with a large set, unlinked while open, then a crash: the next mount frees
/// every block of the set (orphan reclaim), and the free count is as before the file.
#[test]
fn an_open_unlinked_file_with_a_large_set_is_reclaimed_after_a_crash() {
    let vol = memory_volume(16 << 20, VolumeConfig::synchronous());
    let _keep = new_file(&vol, ROOT_INO, b"keep");
    let base = settled_free(&vol);
    let f = new_file(&vol, ROOT_INO, b"f");
    for i in 0..5u8 {
        set(
            &vol,
            f,
            &[b'u', b's', b'e', b'r', b'.', b'a' + i],
            &[i; 60000],
        )
        .unwrap();
    }
    vol.write(R, f, 0, &[7; 8192]).unwrap();
    assert!(blocks_of(&vol, f) > 70);
    vol.open_handle(f).unwrap();
    vol.unlink(R, ROOT_INO, b"f").unwrap();
    // Still readable through the handle.
    assert_eq!(vol.getxattr(R, f, b"user.c").unwrap(), [2; 60000]);
    // Crash with the handle open.
    vol.sync().unwrap();
    let img = image_of(&vol);
    vol.abandon();
    drop(vol);
    let vol = Volume::open_region(Region::from_image(&img), VolumeConfig::synchronous()).unwrap();
    assert!(vol.getattr(f).is_err(), "the orphan was reaped");
    assert_eq!(settled_free(&vol), base);
    assert_fsck_clean(&vol);
    // And the same without a crash: the last release frees it all.
    let g = new_file(&vol, ROOT_INO, b"g");
    set(&vol, g, b"user.big", &[1; 65536]).unwrap();
    vol.open_handle(g).unwrap();
    vol.unlink(R, ROOT_INO, b"g").unwrap();
    vol.release_handle(g).unwrap();
    assert_eq!(settled_free(&vol), base);
    assert_fsck_clean(&remount(vol));
}

/// rename over a file with a large set frees the whole set with the file.
#[test]
fn rename_over_a_file_with_a_large_set_frees_the_set() {
    let vol = memory_volume(16 << 20, VolumeConfig::synchronous());
    let a = new_file(&vol, ROOT_INO, b"a");
    let base = settled_free(&vol);
    let b = new_file(&vol, ROOT_INO, b"b");
    for i in 0..4u8 {
        set(
            &vol,
            b,
            &[b'u', b's', b'e', b'r', b'.', b'0' + i],
            &[i; 65536],
        )
        .unwrap();
    }
    vol.rename(R, ROOT_INO, b"a", ROOT_INO, b"b", RenameFlags::default())
        .unwrap();
    assert_eq!(vol.lookup(R, ROOT_INO, b"b").unwrap().ino, a);
    assert_eq!(settled_free(&vol), base);
    assert_fsck_clean(&remount(vol));
}

/// The image after `fsck --repair` (through a file, as the tool runs).
fn repair(img: &[u8]) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!(
        "zcfs-review-xattrs-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("img");
    std::fs::write(&path, img).unwrap();
    let report = fsck::fsck_path(&path, true).unwrap();
    assert!(report.is_clean(), "after repair: {:?}", report.problems);
    let out = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    out
}

/// Recompute an index block's checksum after editing it (`n` block numbers).
fn reseal_index(b: &mut [u8], n: usize) {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..28]), &b[32..32 + 8 * n]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
}

/// A damaged index whose checksum is valid (a writer's bug, or a hostile image) and
/// that points at the superblock, the log, the inode table, itself, past the end, lists
/// a block twice, lists 0 or 257 blocks, or has a length that overflows: a typed error
/// at mount, a report naming the inode from fsck, no panic from a repairing fsck.
#[test]
fn a_damaged_index_pointing_outside_its_set_is_refused() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    set(&vol, f, b"user.a", &[5; 10000]).unwrap();
    vol.checkpoint_now().unwrap();
    let geo = vol.geometry();
    let img = image_of(&vol);
    vol.abandon();
    let idx = (0..img.len() / BLOCK)
        .find(|b| &img[b * BLOCK..b * BLOCK + 4] == b"ZXAI")
        .expect("an index block");
    let at = idx * BLOCK;
    let n = u32::from_le_bytes(img[at + 12..at + 16].try_into().unwrap()) as usize;
    assert_eq!(n, 3);
    let ptr = move |i: usize| at + 32 + 8 * i;
    type Edit = Box<dyn Fn(&mut [u8])>;
    let point_at = |blk: u64| -> Edit {
        Box::new(move |img: &mut [u8]| {
            img[ptr(1)..ptr(1) + 8].copy_from_slice(&blk.to_le_bytes());
            reseal_index(&mut img[at..at + BLOCK], 3);
        })
    };
    let second = u64::from_le_bytes(img[ptr(1)..ptr(1) + 8].try_into().unwrap());
    let cases: Vec<(&str, Edit)> = vec![
        ("zero", point_at(0)),
        ("superblock", point_at(1)),
        ("log", point_at(geo.log_start + 1)),
        ("inode table", point_at(geo.itable_start)),
        ("itself", point_at(idx as u64)),
        ("past the end", point_at(geo.total_blocks)),
        ("far past the end", point_at(u64::MAX / 2)),
        (
            "twice",
            Box::new(move |img: &mut [u8]| {
                img[ptr(2)..ptr(2) + 8].copy_from_slice(&second.to_le_bytes());
                reseal_index(&mut img[at..at + BLOCK], 3);
            }),
        ),
        (
            "0 blocks",
            Box::new(move |img: &mut [u8]| {
                img[at + 12..at + 16].copy_from_slice(&0u32.to_le_bytes());
                reseal_index(&mut img[at..at + BLOCK], 0);
            }),
        ),
        (
            "257 blocks",
            Box::new(move |img: &mut [u8]| {
                img[at + 12..at + 16].copy_from_slice(&257u32.to_le_bytes());
                for i in 3..257 {
                    let p = geo.data_start + 100 + i as u64;
                    img[ptr(i)..ptr(i) + 8].copy_from_slice(&p.to_le_bytes());
                }
                reseal_index(&mut img[at..at + BLOCK], 257);
            }),
        ),
        (
            "used overflows",
            Box::new(move |img: &mut [u8]| {
                img[at + 8..at + 12].copy_from_slice(&u32::MAX.to_le_bytes());
                reseal_index(&mut img[at..at + BLOCK], 3);
            }),
        ),
        (
            "a huge count",
            Box::new(move |img: &mut [u8]| {
                img[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
                reseal_index(&mut img[at..at + BLOCK], 3);
            }),
        ),
    ];
    for (what, edit) in cases {
        let mut bad = img.clone();
        edit(&mut bad);
        let e = Volume::open_region(Region::from_image(&bad), VolumeConfig::synchronous())
            .err()
            .unwrap_or_else(|| panic!("{what}: a damaged index mounted"));
        assert!(matches!(e, FsError::Corrupt(_)), "{what}: {e}");
        let report = fsck::fsck_image(&bad).unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains(&format!("inode {f}"))),
            "{what}: {:?}",
            report.problems
        );
        // A repairing fsck drops the unreadable set: the volume mounts, clean.
        let repaired = repair(&bad);
        let v = Volume::open_region(Region::from_image(&repaired), VolumeConfig::synchronous())
            .unwrap_or_else(|e| panic!("{what}: repaired volume: {e}"));
        assert_eq!(v.listxattr(R, f).unwrap(), Vec::<Vec<u8>>::new(), "{what}");
        assert_fsck_clean(&v);
    }
}

/// Removing an attribute from a large set on a full volume: Linux file systems
/// (ext4, tmpfs) always let a caller remove an xattr, which is how one frees the
/// space; here the copy-on-write rewrite needs as many fresh blocks as the remaining
/// set takes (up to 256 for one removal), which come from the metadata reserve.
#[test]
fn removing_an_xattr_from_a_large_set_works_on_a_full_volume() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    for i in 0..4u8 {
        set(
            &vol,
            f,
            &[b'u', b's', b'e', b'r', b'.', b'0' + i],
            &[i; 60000],
        )
        .unwrap();
    }
    let filler = new_file(&vol, ROOT_INO, b"filler");
    let mut at = 0u64;
    while vol.write(R, filler, at, &[0xF0; 4096]).is_ok() {
        at += 4096;
    }
    assert!(settled_free(&vol) < 4);
    // Removing one of four values: the remaining three (45 blocks) need rewriting.
    vol.removexattr(R, f, b"user.0").unwrap();
    assert_eq!(vol.listxattr(R, f).unwrap().len(), 3);
    assert_fsck_clean(&vol);
}

/// The names in the root directory and `f`'s xattrs: what a crash may keep or lose.
type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

fn snapshot(vol: &Volume, f: u64) -> (Vec<Vec<u8>>, Xattrs) {
    let mut names = Vec::new();
    vol.readdir(ROOT_INO, 0, |e| {
        names.push(e.name);
        true
    })
    .unwrap();
    (names, all_of(vol, f))
}

/// Crash enumeration with batched commits (several large-set changes per batch, so a
/// batch both frees the blocks of a set and takes new ones): replaces that grow and
/// shrink a set across forms, the unlink of an open file with a large set and its
/// release, a rename over a file with a large set. Each image recovers to a prefix of
/// the operations with fsck clean (no block owned twice, none leaked).
#[test]
fn batched_large_set_changes_are_crash_consistent() {
    use zcfs_pmem::crash::CrashConfig;
    let cfg = VolumeConfig {
        batch_ops: 3,
        batch_delay: std::time::Duration::from_secs(3600),
        ..VolumeConfig::default()
    };
    let vol = memory_volume(4 << 20, cfg);
    let f = new_file(&vol, ROOT_INO, b"f");
    let g = new_file(&vol, ROOT_INO, b"g");
    let h = new_file(&vol, ROOT_INO, b"h");
    set(&vol, g, b"user.g", &[4; 30000]).unwrap();
    set(&vol, h, b"user.h", &[5; 20000]).unwrap();
    vol.checkpoint_now().unwrap();
    type Change = Box<dyn Fn(&Volume)>;
    let changes: Vec<Change> = vec![
        Box::new(move |v| set(v, f, b"user.a", &[1; 40000]).unwrap()),
        Box::new(move |v| set(v, f, b"user.b", &[2; 9000]).unwrap()),
        Box::new(move |v| v.removexattr(R, f, b"user.a").unwrap()),
        Box::new(move |v| {
            v.open_handle(g).unwrap();
            v.unlink(R, ROOT_INO, b"g").unwrap();
        }),
        Box::new(move |v| set(v, f, b"user.c", &[3; 65536]).unwrap()),
        Box::new(move |v| v.release_handle(g).unwrap()),
        Box::new(move |v| {
            v.rename(R, ROOT_INO, b"f", ROOT_INO, b"h", RenameFlags::default())
                .unwrap()
        }),
        Box::new(move |v| v.removexattr(R, f, b"user.c").unwrap()),
        Box::new(move |v| v.removexattr(R, f, b"user.b").unwrap()),
    ];
    let mut states = vec![snapshot(&vol, f)];
    // SAFETY: this thread alone uses the volume while recording (no flusher wakes up
    // within the hour-long batch delay).
    unsafe { vol.test_door().start_recording() };
    for (i, c) in changes.iter().enumerate() {
        vol.test_door().mark(i as u64);
        c(&vol);
        states.push(snapshot(&vol, f));
    }
    vol.sync().unwrap();
    let rec = vol.test_door().take_recording().unwrap();
    vol.abandon();
    let crash = CrashConfig {
        pair_limit: 12,
        sampled_pairs: 48,
        random_subsets: 6,
        seed: 0x7a78,
    };
    // Batched: any prefix of the changes begun.
    every_crash_image_recovers_to_a_state(
        "batched large xattr sets",
        &rec,
        &crash,
        &states,
        |started| 0..=started,
        |v| snapshot(v, f),
    );
}

/// One flipped bit in a data block of a large set: the mount refuses the whole volume
/// (Corrupt), and a repairing fsck cannot make it mountable again (it rewrites the
/// block count but leaves the inode pointing at the damaged set), so every other file
/// stays out of reach. e2fsck clears a damaged EA block; a repair here could drop the
/// set (xattr_block 0) and release the blocks it could claim. Also true of a damaged
/// single-form block before version 4; a 257-block set widens the exposure.
#[test]
fn a_repairing_fsck_makes_a_volume_with_a_damaged_set_mountable() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let other = new_file(&vol, ROOT_INO, b"other");
    vol.write(R, other, 0, b"precious").unwrap();
    set(&vol, f, b"user.a", &[5; 10000]).unwrap();
    vol.checkpoint_now().unwrap();
    let mut img = image_of(&vol);
    vol.abandon();
    let idx = (0..img.len() / BLOCK)
        .find(|b| &img[b * BLOCK..b * BLOCK + 4] == b"ZXAI")
        .expect("an index block");
    let first = u64::from_le_bytes(img[idx * BLOCK + 32..idx * BLOCK + 40].try_into().unwrap());
    img[first as usize * BLOCK + 100] ^= 1;
    assert!(Volume::open_region(Region::from_image(&img), VolumeConfig::synchronous()).is_err());
    let repaired = repair(&img);
    let vol = Volume::open_region(Region::from_image(&repaired), VolumeConfig::synchronous())
        .expect("the repaired volume mounts");
    let mut buf = [0u8; 8];
    assert_eq!(vol.read(other, 0, &mut buf).unwrap(), 8);
    assert_eq!(&buf, b"precious");
    assert_fsck_clean(&vol);
}
