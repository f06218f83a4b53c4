#![no_main]
//! Patches of a valid template image, so mutations reach past the checksums into
//! recovery, the loader and fsck.
use std::sync::OnceLock;

static TEMPLATE: OnceLock<Vec<u8>> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let t = TEMPLATE.get_or_init(zcfs_volume::fuzzing::template_image);
    let patches: Vec<(u32, u8)> = data
        .chunks_exact(5)
        .map(|c| (u32::from_le_bytes([c[0], c[1], c[2], c[3]]), c[4]))
        .collect();
    zcfs_volume::fuzzing::exercise_patched(t, &patches);
});
