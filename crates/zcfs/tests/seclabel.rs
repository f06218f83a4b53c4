//! LSM security labels through a remote mount (issue 11, `ls -l`): by default a mount
//! does not carry `security.selinux` (nor Smack's labels), as an NFS mount without
//! labeled NFS does: get, set and remove answer EOPNOTSUPP and listings leave them out,
//! so `ls -l` asks once per mount instead of once per file. `-o seclabel` carries them
//! as stored xattrs. Other `security.` names (file capabilities) are carried either way.
//! Root required (network namespaces), as in CI.

mod common;
use common::remote::*;
use common::xattr::{capability, get, list, remove, set};
use std::path::Path;

const LABEL: &[u8] = b"system_u:object_r:etc_t:s0\0";

/// GETXATTR requests the mount at `mp` answered so far (`zcfs stat --json`).
fn getxattrs_answered(mp: &Path) -> u64 {
    let out = common::run_ok(common::zcfs().arg("stat").arg(mp).arg("--json"));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    r["ops"]["getxattr"]["count"].as_u64().unwrap_or(0)
}

/// GETXATTR requests an `ls -l` of `dir` on the mount at `mp` cost.
fn getxattrs_of_ls(mp: &Path, dir: &Path) -> u64 {
    let before = getxattrs_answered(mp);
    let out = common::run_ok(std::process::Command::new("ls").arg("-l").arg(dir));
    assert!(!out.stdout.is_empty());
    getxattrs_answered(mp) - before
}

#[test]
fn security_labels_are_carried_only_with_seclabel() {
    let net = Net::new();
    let srv = Served::new(&net, "seclabel", &[]);
    let plain = RemoteMount::new(&net, &srv, "seclabel-plain", &[]);
    let labelled = RemoteMount::new(&net, &srv, "seclabel-on", &["-o", "seclabel"]);
    let f = plain.mp.join("f");
    std::fs::write(&f, b"x").unwrap();
    let f_on = labelled.mp.join("f");

    // Stored through the mount that carries labels (as a client whose policy labels
    // files would), beside an ordinary xattr.
    set(&f_on, "security.selinux", LABEL).unwrap();
    set(&f, "user.k", b"v").unwrap();
    assert_eq!(get(&f_on, "security.selinux").unwrap(), LABEL);

    // The default mount carries none: every request for a label is refused, whether
    // one is stored or not, and listings leave it out.
    for name in [
        "security.selinux",
        "security.SMACK64",
        "security.SMACK64EXEC",
    ] {
        assert_eq!(get(&f, name), Err(libc::EOPNOTSUPP), "get {name}");
        assert_eq!(set(&f, name, b"x\0"), Err(libc::EOPNOTSUPP), "set {name}");
        assert_eq!(remove(&f, name), Err(libc::EOPNOTSUPP), "remove {name}");
    }
    assert_eq!(list(&f), ["user.k"]);
    assert_eq!(list(&f_on), ["security.selinux", "user.k"]);
    // Nothing the default mount refused touched the stored label.
    assert_eq!(get(&f_on, "security.selinux").unwrap(), LABEL);

    // File capabilities are the file's, not a host's policy: carried either way.
    let cap = capability();
    set(&f, "security.capability", &cap).unwrap();
    assert_eq!(get(&f, "security.capability").unwrap(), cap);
    assert_eq!(get(&f_on, "security.capability").unwrap(), cap);
    assert_eq!(list(&f), ["security.capability", "user.k"]);
    remove(&f, "security.capability").unwrap();

    drop((plain, labelled));

    // `ls -l` (coreutils asks every file's label until the file system says it has
    // none to give): once per mount by default; once per file with seclabel, which
    // shows what the count measures. Counted on `noacl` mounts, where every ACL
    // lookup of `ls` is one request: with FUSE_POSIX_ACL the kernel's ACL cache
    // decides how many reach the mount (the test's caller, root, does not own the
    // volume's root, whose ACL the kernel fetches on every path walk then).
    let plain = RemoteMount::new(&net, &srv, "seclabel-plain-noacl", &["-o", "noacl"]);
    let labelled = RemoteMount::new(&net, &srv, "seclabel-on-noacl", &["-o", "seclabel,noacl"]);
    let n = 200;
    let dir = plain.mp.join("d");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..n {
        std::fs::write(dir.join(format!("f{i}")), b"y").unwrap();
    }
    let without = getxattrs_of_ls(&plain.mp, &dir);
    let with = getxattrs_of_ls(&labelled.mp, &labelled.mp.join("d"));
    // Per file its ACL; the directory's two ACLs; one label for the whole listing.
    assert_eq!(without, n + 3, "ls -l through the default mount");
    assert_eq!(with, 2 * n + 3, "ls -l through the seclabel mount");
    drop((plain, labelled));
}
