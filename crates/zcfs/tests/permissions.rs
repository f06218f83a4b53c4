//! Permission checks through real FUSE mounts, compared with tmpfs (issue 10): the
//! file system decides who may do what, not only the kernel.

mod common;
use common::mount::Mount;
use common::posix::compare_with_tmpfs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

fn base_in(m: &Mount) -> PathBuf {
    let base = m.path("base");
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
    base
}

fn assert_same_as_tmpfs(base: &std::path::Path) {
    let diffs = compare_with_tmpfs(base);
    assert!(
        diffs.is_empty(),
        "{} steps differ from tmpfs:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

/// Without default_permissions the kernel checks (almost) nothing: every rule is the
/// volume's. No caching, so each path walk asks the file system as its caller.
#[test]
fn local_mount_without_default_permissions_matches_tmpfs() {
    let m = Mount::volume_with("perm-own", "64M", &[], &["-o", "allow_other,cache=none"]);
    assert_same_as_tmpfs(&base_in(&m));
}

/// With default_permissions the kernel checks first; the volume must agree with it.
#[test]
fn local_mount_with_default_permissions_matches_tmpfs() {
    let m = Mount::volume_with(
        "perm-kernel",
        "64M",
        &[],
        &["-o", "allow_other,default_permissions"],
    );
    assert_same_as_tmpfs(&base_in(&m));
}
