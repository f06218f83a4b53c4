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

/// `uid=`, `gid=`, `umask=` change only what is shown: with POSIX ACLs (the default,
/// which makes the kernel check permissions) the kernel judges by the shown owner, so
/// the volume must still check by the real one. A root-owned 0600 file shown as
/// alice's stays closed to alice.
#[test]
fn shown_owners_grant_nothing() {
    use common::posix::{run_as, Call, ALICE};
    let m = Mount::volume_with(
        "perm-shown",
        "64M",
        &[],
        &["-o", "allow_other,uid=1001,gid=1001"],
    );
    let base = base_in(&m);
    let f = base.join("secret");
    std::fs::write(&f, b"root's").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&f).unwrap().uid(),
        1001,
        "shown as alice's"
    );
    for call in [
        Call::Open("secret", libc::O_RDONLY, 0),
        Call::Write("secret"),
        Call::Chmod("secret", 0o666),
    ] {
        let e = run_as(&base, ALICE, &call);
        assert!(
            e == libc::EACCES || e == libc::EPERM,
            "{call:?} as alice: errno {e}"
        );
    }
    assert_eq!(std::fs::read(&f).unwrap(), b"root's");
}

/// `noacl` with default_permissions: the kernel checks the mode bits alone (no
/// FUSE_POSIX_ACL), and with an access ACL the group bits are its mask, so a deny
/// entry the volume keeps is invisible to it. The volume must still check: bob, named
/// with no permissions but in the file's group (whose mask allows rw), stays out, as
/// he does on the same mount without default_permissions.
#[test]
fn the_kernel_checks_without_acls_grant_nothing() {
    use common::posix::{run_as, Call, BOB_IN_1001, G, GO, M, O, ROOT, U, UO};
    let m = Mount::volume_with(
        "perm-noacl",
        "64M",
        &[],
        &["-o", "allow_other,default_permissions,noacl"],
    );
    let base = base_in(&m);
    let f = base.join("f");
    std::fs::write(&f, b"not bob's").unwrap();
    std::os::unix::fs::chown(&f, Some(0), Some(1001)).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o660)).unwrap();
    let e = run_as(
        &base,
        ROOT,
        &Call::SetAcl(
            "f",
            "system.posix_acl_access",
            &[
                (UO, 6, 0),
                (U, 0, 1002),
                (GO, 6, 0),
                (G, 6, 1001),
                (M, 6, 0),
                (O, 0, 0),
            ],
        ),
    );
    assert_eq!(e, 0, "setting the ACL");
    for call in [Call::Open("f", libc::O_RDONLY, 0), Call::Write("f")] {
        let e = run_as(&base, BOB_IN_1001, &call);
        assert_eq!(
            e,
            libc::EACCES,
            "{call:?} as bob, whom the ACL names with ---"
        );
    }
    assert_eq!(std::fs::read(&f).unwrap(), b"not bob's");
}
