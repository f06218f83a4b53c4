#![no_main]
//! The handshake decoders and proof checks, and the authenticated framing (decode and
//! verify) on arbitrary bytes: never a panic, a forged message never opens, a sealed
//! one opens exactly once (zcfs_protocol::channel::exercise; a stable-toolchain smoke
//! run of it is the protocol crate's `fuzz_smoke_handshake_and_authenticated_framing`).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    zcfs_protocol::channel::exercise(data);
});
