#![no_main]
//! Layer-2 lane commands from a peer (zcfs-protocol's l2 module): request parts
//! gathered, requests and replies decoded. Never a panic; the parts held stay bounded,
//! and a request gathered whole splits and gathers back to the same bytes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = zcfs_protocol::l2::exercise(data);
});
