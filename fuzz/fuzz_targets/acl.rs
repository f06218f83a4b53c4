#![no_main]
//! ACL xattr values (system.posix_acl_access / _default) from users and peers.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    zcfs_volume::fuzzing::exercise_acl(data);
});
