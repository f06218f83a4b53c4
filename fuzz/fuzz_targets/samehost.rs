#![no_main]
//! The same-host control decoder (zcfs-samehost proto.rs) on arbitrary bytes: a peer's
//! request and, for the client, a server's reply. Every input must give a value or an
//! error, never a panic; a decoded message must encode to bytes that decode to it.
use zcfs_samehost::proto::{Reply, Request};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Request::decode(data) {
        assert_eq!(Request::decode(&r.encode()), Ok(r));
    }
    if let Ok(r) = Reply::decode(data) {
        assert_eq!(Reply::decode(&r.encode()), Ok(r));
    }
});
