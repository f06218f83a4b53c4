//! POSIX ACLs (issue 14): a script of ACL steps — setting access and default ACLs,
//! reading through them as other users, chmod against the mask, inheritance at create
//! with and without a umask, set-group-ID after an ACL change, invalid ACLs — run as
//! several users on tmpfs (the kernel's own ACL code) and on zcfs in the same test,
//! compared step for step, mode, owner and ACL bytes included. zcfs runs it where the
//! kernel enforces the ACLs (the default, FUSE_POSIX_ACL), where only the volume does
//! (`noacl` without default_permissions), and through a server, with and without the
//! kernel's help.

mod common;
use common::mount::Mount;
use common::posix::{
    compare_steps_with_tmpfs, Call, Step, Who, ACCESS, ALICE, BOB, BOB_IN_1001, DEFAULT, G, GO, M,
    NOBODY, O, ROOT, U, UO,
};
use std::path::{Path, PathBuf};

const CREAT_W: i32 = libc::O_CREAT | libc::O_WRONLY;

fn s(who: Who, call: Call, why: &'static str) -> Step {
    Step { who, call, why }
}

/// The ACL script; `base` is a root-owned 0777 directory.
fn acl_script() -> Vec<Step> {
    use Call::*;
    vec![
        // An access ACL lets another user in where the mode bits do not.
        s(
            ALICE,
            OpenUmask("f", CREAT_W, 0o600, 0o022),
            "alice creates f 0600",
        ),
        s(
            BOB,
            Open("f", libc::O_RDONLY, 0),
            "bob cannot read f by its mode",
        ),
        s(
            ALICE,
            SetAcl(
                "f",
                ACCESS,
                &[(UO, 6, 0), (U, 4, 1002), (GO, 0, 0), (M, 4, 0), (O, 0, 0)],
            ),
            "alice gives bob read (the mode's group bits become the mask)",
        ),
        s(
            BOB,
            Open("f", libc::O_RDONLY, 0),
            "bob reads f through the ACL",
        ),
        s(BOB, Access("f", libc::R_OK), "access(2) agrees"),
        s(BOB, Open("f", libc::O_WRONLY, 0), "but may not write"),
        s(
            NOBODY,
            Open("f", libc::O_RDONLY, 0),
            "nobody still may not read",
        ),
        s(
            BOB,
            SetAcl("f", ACCESS, &[(UO, 6, 0), (GO, 6, 0), (O, 6, 0)]),
            "only the owner sets an ACL",
        ),
        s(
            ALICE,
            Chmod("f", 0o600),
            "chmod sets the mask to the group bits (none)",
        ),
        s(BOB, Open("f", libc::O_RDONLY, 0), "the mask now denies bob"),
        s(ALICE, Chmod("f", 0o660), "the mask grants rw again"),
        s(
            BOB,
            Write("f"),
            "bob's entry is r only: the mask does not add w",
        ),
        s(BOB, Open("f", libc::O_RDONLY, 0), "bob reads again"),
        // Named groups, and a group entry that matches but does not grant.
        s(
            ALICE,
            SetAcl(
                "f",
                ACCESS,
                &[(UO, 6, 0), (GO, 0, 0), (G, 6, 1001), (M, 6, 0), (O, 4, 0)],
            ),
            "group 1001 gets rw, the owning group nothing",
        ),
        s(BOB_IN_1001, Write("f"), "a member of 1001 writes"),
        s(ALICE, Chmod("f", 0o640), "the mask is r now"),
        s(BOB_IN_1001, Write("f"), "the mask stops the group's write"),
        s(
            BOB,
            Open("f", libc::O_RDONLY, 0),
            "bob, in no listed group, is other: r",
        ),
        s(
            ALICE,
            SetAcl("f", ACCESS, &[(UO, 6, 0), (GO, 4, 0), (O, 0, 0)]),
            "an ACL the mode can say is not kept; the mode follows it",
        ),
        s(ALICE, RemoveXattr("f", ACCESS), "removing no ACL succeeds"),
        s(
            ALICE,
            SetAcl(
                "f",
                ACCESS,
                &[(UO, 6, 0), (U, 4, 1002), (GO, 4, 0), (O, 0, 0)],
            ),
            "a named entry without a mask is invalid",
        ),
        s(
            ALICE,
            SetAcl("f", ACCESS, &[(GO, 4, 0), (UO, 6, 0), (O, 0, 0)]),
            "entries out of order are invalid",
        ),
        s(
            ALICE,
            SetAcl("f", DEFAULT, &[(UO, 6, 0), (GO, 4, 0), (O, 0, 0)]),
            "a file has no default ACL",
        ),
        s(
            ALICE,
            SetAcl(
                "f",
                ACCESS,
                &[(UO, 6, 0), (U, 6, 1002), (GO, 4, 0), (M, 6, 0), (O, 0, 0)],
            ),
            "bob gets rw",
        ),
        s(
            ALICE,
            RemoveXattr("f", ACCESS),
            "removing the ACL keeps the mode",
        ),
        s(
            BOB,
            Open("f", libc::O_RDONLY, 0),
            "and takes bob's access away",
        ),
        // An ACL change by an owner outside the file's group drops set-group-ID.
        s(ROOT, OpenUmask("sg", CREAT_W, 0o660, 0), "root creates sg"),
        s(ROOT, Chown("sg", 1001, 1002), "sg is alice's, group bob's"),
        s(ROOT, Chmod("sg", 0o2660), "sg is set-group-ID"),
        s(
            ALICE,
            SetAcl(
                "sg",
                ACCESS,
                &[(UO, 6, 0), (U, 4, 1002), (GO, 6, 0), (M, 6, 0), (O, 0, 0)],
            ),
            "alice is not in group 1002: set-group-ID goes",
        ),
        // Default ACLs: inherited instead of the umask.
        s(ALICE, MkdirUmask("dd", 0o755, 0o022), "alice makes dd"),
        s(
            ALICE,
            SetAcl(
                "dd",
                DEFAULT,
                &[(UO, 7, 0), (U, 7, 1002), (GO, 5, 0), (M, 7, 0), (O, 5, 0)],
            ),
            "dd gets a default ACL with bob rwx",
        ),
        s(
            ALICE,
            OpenUmask("dd/f1", CREAT_W, 0o666, 0o077),
            "umask 077 is ignored under a default ACL",
        ),
        s(BOB, Write("dd/f1"), "bob writes through the inherited ACL"),
        s(NOBODY, Write("dd/f1"), "other is r only"),
        s(
            ALICE,
            MkdirUmask("dd/sub", 0o777, 0o077),
            "a subdirectory inherits access and default ACLs",
        ),
        s(
            ALICE,
            OpenUmask("dd/sub/f2", CREAT_W, 0o640, 0o000),
            "and passes them on, masked by the mode",
        ),
        s(
            BOB,
            Open("dd/sub/f2", libc::O_RDONLY, 0),
            "bob reads f2 (mask r from mode 0640)",
        ),
        s(BOB, Write("dd/sub/f2"), "but may not write it"),
        s(ALICE, Mkfifo("dd/fifo", 0o666), "a fifo inherits too"),
        s(ALICE, Symlink("f1", "dd/ln"), "a symlink takes no ACL"),
        s(
            ALICE,
            SetAcl("dd", DEFAULT, &[(UO, 7, 0), (GO, 7, 0), (O, 0, 0)]),
            "a default ACL of only base entries",
        ),
        s(
            ALICE,
            OpenUmask("dd/f3", CREAT_W, 0o666, 0o022),
            "is kept and masks the mode: no umask",
        ),
        s(
            ALICE,
            RemoveXattr("dd", DEFAULT),
            "dd loses its default ACL",
        ),
        s(
            ALICE,
            OpenUmask("dd/f4", CREAT_W, 0o666, 0o077),
            "the umask applies again",
        ),
        // Set-group-ID directories with a default ACL: group and bit as without one,
        // the ACL on top; chmod by an owner outside the group drops the bit and
        // rewrites the mask.
        s(ROOT, Mkdir("sgd", 0o777), "root makes sgd"),
        s(
            ROOT,
            Chown("sgd", 1001, 1002),
            "sgd is alice's, group bob's",
        ),
        s(ROOT, Chmod("sgd", 0o2777), "sgd is set-group-ID"),
        s(
            ALICE,
            SetAcl(
                "sgd",
                DEFAULT,
                &[(UO, 7, 0), (GO, 7, 0), (G, 5, 1001), (M, 7, 0), (O, 5, 0)],
            ),
            "alice gives sgd a default ACL",
        ),
        s(
            ALICE,
            OpenUmask("sgd/x", CREAT_W, 0o2755, 0o022),
            "group 1002 from the directory; alice is not in it: no set-group-ID",
        ),
        s(
            BOB,
            MkdirUmask("sgd/sub", 0o755, 0o077),
            "a subdirectory: group, bit and ACLs",
        ),
        s(
            BOB,
            OpenUmask("sgd/sub/y", CREAT_W, 0o2770, 0o077),
            "bob is in 1002: keeps the bit",
        ),
        s(
            ALICE,
            Chmod("sgd/x", 0o2750),
            "alice's chmod cannot set the bit; the mask is r-x",
        ),
        s(
            BOB,
            Write("sgd/sub/y"),
            "a write by a group member keeps a non-executable setgid",
        ),
        // Directory ACLs govern search and create.
        s(ROOT, Mkdir("p", 0o700), "root makes p 0700"),
        s(ROOT, OpenUmask("p/z", CREAT_W, 0o644, 0), "and p/z 0644"),
        s(ALICE, Stat("p/z"), "alice cannot search p"),
        s(
            ROOT,
            SetAcl(
                "p",
                ACCESS,
                &[(UO, 7, 0), (U, 5, 1001), (GO, 0, 0), (M, 5, 0), (O, 0, 0)],
            ),
            "root lets alice search and list p",
        ),
        s(ALICE, Stat("p/z"), "alice now reaches p/z"),
        s(
            ALICE,
            OpenUmask("p/y", CREAT_W, 0o644, 0),
            "but may not create in p",
        ),
        s(BOB, Stat("p/z"), "bob still cannot search p"),
        s(ROOT, Chmod("p", 0o770), "root's chmod sets the mask rwx"),
        s(
            ALICE,
            OpenUmask("p/y", CREAT_W, 0o644, 0),
            "alice's entry is r-x: still no create",
        ),
    ]
}

fn assert_same(what: &str, base: &Path) {
    let diffs = compare_steps_with_tmpfs(base, &acl_script());
    assert!(
        diffs.is_empty(),
        "{what}: {} steps differ from tmpfs:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

/// A root-owned 0777 directory under `mp` for the script.
fn base_under(mp: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let b = mp.join("acl");
    std::fs::create_dir(&b).unwrap();
    std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o777)).unwrap();
    b
}

#[test]
fn acls_on_a_local_mount_match_tmpfs() {
    let m = Mount::volume_with("acl-kernel", "256M", &[], &["-o", "allow_other"]);
    assert_same("local mount (kernel enforces)", &base_under(&m.mp));
}

#[test]
fn acls_enforced_by_the_volume_alone_match_tmpfs() {
    // noacl: the kernel neither caches nor enforces ACLs; without default_permissions
    // every check is the volume's (no caching, so each path walk asks the volume).
    let opts = ["-o", "allow_other,noacl,cache=none"];
    let m = Mount::volume_with("acl-volume", "256M", &[], &opts);
    assert_same("local mount, noacl (volume enforces)", &base_under(&m.mp));
}

#[test]
fn acls_through_a_server_match_tmpfs() {
    // With the kernel's checks, and with the server's alone (root on the client acts
    // as root on the server: the test servers do not squash it).
    for opts in ["allow_other", "allow_other,noacl,cache=none"] {
        common::reference::through_a_server("acl", &["-o", opts], |mp| {
            assert_same(&format!("remote mount -o {opts}"), &base_under(mp))
        });
    }
}
