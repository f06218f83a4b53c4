#![no_main]
//! Layer-2 frames from the wire (zcfs-l2): every input must decode to a header or a
//! typed error, never a panic, and a header that decodes must re-encode to the same bytes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    zcfs_l2::frame::exercise(data);
});
