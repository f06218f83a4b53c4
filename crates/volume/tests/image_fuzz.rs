//! Stable-toolchain fuzzing of image parsing and recovery (the cargo-fuzz targets in
//! fuzz/ run the same entry points for longer): damaged images give errors, never
//! panics, and never make a mounted volume misbehave.

use proptest::prelude::*;
use std::sync::OnceLock;
use zcfs_volume::fuzzing::{exercise_acl, exercise_image, exercise_patched, template_image};
use zcfs_volume::layout::LogEntry;

fn template() -> &'static [u8] {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(template_image)
}

/// Offsets biased towards the metadata at the front of the image.
fn patch() -> impl Strategy<Value = (u32, u8)> {
    (
        prop_oneof![0u32..8192, 8192u32..90_000, any::<u32>()],
        1u8..=255,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    #[test]
    fn patched_images_never_panic(patches in prop::collection::vec(patch(), 1..12)) {
        exercise_patched(template(), &patches);
    }

    #[test]
    fn random_images_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..20_000)) {
        exercise_image(&bytes);
    }

    #[test]
    fn acl_values_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..80),
        entries in prop::collection::vec((prop::sample::select(vec![1u16, 2, 4, 8, 0x10, 0x20, 3]), 0u16..9, prop_oneof![Just(u32::MAX), 0u32..4]), 0..10),
    ) {
        // Raw bytes, and a version header before random entries (to get past it).
        exercise_acl(&bytes);
        let mut v = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        exercise_acl(&v);
    }

    #[test]
    fn log_entry_decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..600), len in any::<u64>()) {
        let _ = LogEntry::decode(&bytes, len);
    }
}

#[test]
fn template_itself_is_clean() {
    let r = zcfs_volume::fsck::fsck_image(template()).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    assert!(
        r.entries_replayed > 0,
        "template should leave entries to replay"
    );
}

#[test]
fn every_single_byte_flip_in_metadata_is_survived() {
    // Exhaustive over the superblocks, the log header and the inode table of the template.
    let t = template();
    let geo = zcfs_volume::Geometry::plan(t.len() as u64, Some(32), Some(16 << 10)).unwrap();
    let itable_end = ((geo.itable_start + geo.itable_blocks) * 4096) as u32;
    let ranges = [
        (0u32, 512u32),
        (4096, 4096 + 512),
        (
            (geo.log_start * 4096) as u32,
            (geo.log_start * 4096 + 128) as u32,
        ),
        (
            (geo.itable_start * 4096) as u32,
            itable_end.min((geo.itable_start * 4096) as u32 + 1024),
        ),
    ];
    let mut n = 0;
    for (s, e) in ranges {
        for off in s..e {
            exercise_patched(t, &[(off, 0x80)]);
            n += 1;
        }
    }
    assert!(n > 2000);
}
