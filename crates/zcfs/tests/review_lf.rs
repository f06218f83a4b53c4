//! Review of the leader/follower reply reading, FUSE without FUSE_ATOMIC_O_TRUNC, and
//! protocol 10's directory attributes in replies.

mod common;
use common::mount::Mount;
use common::posix::{compare_steps_with_tmpfs, Call, Step, ALICE, BOB, G, GO, M, O, ROOT, U, UO};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

fn base_in(m: &Mount) -> PathBuf {
    let base = m.path("base");
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
    base
}

fn s(who: common::posix::Who, call: Call, why: &'static str) -> Step {
    Step { who, call, why }
}

/// O_TRUNC through open(2) by owners and others: set-id bits, ACL grants and denials.
fn o_trunc_steps() -> Vec<Step> {
    use Call::*;
    const RO: i32 = libc::O_RDONLY;
    const WO: i32 = libc::O_WRONLY;
    const CR: i32 = libc::O_CREAT | libc::O_WRONLY;
    const T: i32 = libc::O_TRUNC;
    let (r, a, b) = (ROOT, ALICE, BOB);
    vec![
        s(r, Mkdir("t", 0o777), "setup"),
        // A setuid+setgid (group-exec) file alice owns, writable by all.
        s(a, Open("t/s1", CR, 0o644), "setup"),
        s(a, Write("t/s1"), "setup"),
        s(a, Chmod("t/s1", 0o6777), "setup"),
        s(
            b,
            Open("t/s1", WO | T, 0),
            "other's O_WRONLY|O_TRUNC drops set-id bits",
        ),
        s(a, Write("t/s1"), "setup"),
        s(a, Chmod("t/s1", 0o6777), "setup"),
        s(
            b,
            Open("t/s1", RO | T, 0),
            "other's O_RDONLY|O_TRUNC drops set-id bits",
        ),
        // Empty already.
        s(a, Chmod("t/s1", 0o6777), "setup"),
        s(
            b,
            Open("t/s1", WO | T, 0),
            "O_TRUNC of an empty set-id file",
        ),
        // The owner's own setuid file.
        s(a, Open("t/s2", CR, 0o644), "setup"),
        s(a, Write("t/s2"), "setup"),
        s(a, Chmod("t/s2", 0o4755), "setup"),
        s(
            a,
            Open("t/s2", WO | T, 0),
            "owner's O_TRUNC of own setuid file",
        ),
        s(a, Chmod("t/s2", 0o4755), "setup"),
        s(a, Write("t/s2"), "setup"),
        s(a, Chmod("t/s2", 0o4755), "setup"),
        s(
            a,
            Open("t/s2", RO | T, 0),
            "owner's O_RDONLY|O_TRUNC of own setuid",
        ),
        // Not writable by the owner.
        s(a, Write("t/s2"), "setup"),
        s(a, Chmod("t/s2", 0o444), "setup"),
        s(
            a,
            Open("t/s2", RO | T, 0),
            "owner without write: O_RDONLY|O_TRUNC",
        ),
        // ACL grants and denials.
        s(r, Open("t/acl", CR, 0o640), "setup"),
        s(r, Write("t/acl"), "setup"),
        s(
            r,
            SetAcl(
                "t/acl",
                common::posix::ACCESS,
                &[(UO, 6, 0), (U, 6, 1002), (GO, 4, 0), (M, 6, 0), (O, 0, 0)],
            ),
            "setup: bob may write by ACL only",
        ),
        s(b, Open("t/acl", RO | T, 0), "ACL-granted O_RDONLY|O_TRUNC"),
        s(r, Write("t/acl"), "setup"),
        s(
            r,
            SetAcl(
                "t/acl",
                common::posix::ACCESS,
                &[
                    (UO, 6, 0),
                    (U, 4, 1002),
                    (GO, 6, 0),
                    (G, 6, 1002),
                    (M, 6, 0),
                    (O, 6, 0),
                ],
            ),
            "setup: bob named read-only, others rw",
        ),
        s(b, Open("t/acl", RO | T, 0), "ACL-denied O_RDONLY|O_TRUNC"),
        s(b, Open("t/acl", WO | T, 0), "ACL-denied O_WRONLY|O_TRUNC"),
        s(b, Truncate("t/acl", 0), "ACL-denied truncate"),
    ]
}

fn assert_o_trunc_as_tmpfs(m: &Mount) {
    let diffs = compare_steps_with_tmpfs(&base_in(m), &o_trunc_steps());
    assert!(
        diffs.is_empty(),
        "{} steps differ from tmpfs:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

#[test]
fn o_trunc_matches_tmpfs_with_default_permissions() {
    let m = Mount::volume_with("lf-trunc-dp", "64M", &[], &["-o", "allow_other"]);
    assert_o_trunc_as_tmpfs(&m);
}

#[test]
fn o_trunc_matches_tmpfs_without_default_permissions() {
    let m = Mount::volume_with(
        "lf-trunc-own",
        "64M",
        &[],
        &["-o", "allow_other,noacl,cache=none"],
    );
    assert_o_trunc_as_tmpfs(&m);
}
