#![no_main]
//! Whole images from the fuzzer: mount, fsck, walk, mutate; must never panic.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    zcfs_volume::fuzzing::exercise_image(data);
});
