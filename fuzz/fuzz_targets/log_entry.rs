#![no_main]
//! The log entry decoder on arbitrary bytes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = zcfs_volume::layout::LogEntry::decode(data, 1 << 30);
});
