//! A file's capabilities (`security.capability`) go with any change of its contents or
//! owner, whoever makes it, as on Linux's own file systems (`file_remove_privs`,
//! ATTR_KILL_PRIV): a FUSE mount takes FUSE_HANDLE_KILLPRIV_V2, so the kernel leaves
//! that to the volume (review 31: a direct_io write kept them). Anyone who may write
//! the file may remove them (the kernel's killpriv asks as the writer); no one else
//! but root may.

mod common;
use common::*;
use zcfs_volume::*;

const R: &Cred = &Cred::ROOT;

/// VFS_CAP_REVISION_2 with CAP_NET_BIND_SERVICE permitted.
fn cap() -> Vec<u8> {
    [0x0200_0000u32, 1 << 10, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

fn user() -> Cred {
    Cred::new(1000, 1000, vec![])
}

fn has_cap(vol: &Volume, ino: u64) -> bool {
    vol.getxattr(R, ino, CAPABILITY_XATTR).is_ok()
}

/// A world-writable file with a capability and another xattr.
fn capable_file(vol: &Volume, name: &[u8]) -> u64 {
    let f = new_file(vol, ROOT_INO, name);
    let all = SetAttr {
        mode: Some(0o666),
        ..Default::default()
    };
    vol.setattr(R, f, &all, SizeRight::Permission).unwrap();
    vol.write(R, f, 0, b"program").unwrap();
    vol.setxattr(R, f, CAPABILITY_XATTR, &cap(), XattrMode::Any)
        .unwrap();
    vol.setxattr(R, f, b"user.k", b"v", XattrMode::Any).unwrap();
    f
}

#[test]
fn writes_truncates_fallocates_and_chowns_remove_the_capability_whoever_makes_them() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    type Change = Box<dyn Fn(&Volume, u64)>;
    let changes: Vec<(&str, Change)> = vec![
        (
            "root's write",
            Box::new(|v, f| assert_eq!(v.write(R, f, 0, b"x").unwrap(), 1)),
        ),
        (
            "a user's write",
            Box::new(|v, f| assert_eq!(v.write(&user(), f, 3, b"y").unwrap(), 1)),
        ),
        (
            "a reservation's write",
            Box::new(|v, f| {
                let mut r = v.reserve_write(&user(), f, 0, 5).unwrap();
                r.fill_from(b"hello");
                r.commit().unwrap();
            }),
        ),
        (
            "ftruncate",
            Box::new(|v, f| v.truncate(&user(), f, 2).unwrap()),
        ),
        (
            "truncate by name",
            Box::new(|v, f| {
                let size = SetAttr {
                    size: Some(1),
                    ..Default::default()
                };
                v.setattr(&user(), f, &size, SizeRight::Permission).unwrap();
            }),
        ),
        (
            "chown",
            Box::new(|v, f| {
                let owner = SetAttr {
                    uid: Some(1000),
                    ..Default::default()
                };
                v.setattr(R, f, &owner, SizeRight::Permission).unwrap();
            }),
        ),
        (
            "fallocate",
            Box::new(|v, f| {
                v.fallocate(
                    &user(),
                    f,
                    0,
                    8192,
                    FallocMode::Allocate { keep_size: true },
                )
                .unwrap()
            }),
        ),
    ];
    for (i, (what, change)) in changes.iter().enumerate() {
        let f = capable_file(&vol, format!("f{i}").as_bytes());
        change(&vol, f);
        assert!(!has_cap(&vol, f), "{what} kept the capability");
        assert_eq!(vol.getxattr(R, f, b"user.k").unwrap(), b"v", "{what}");
    }
    assert_fsck_clean(&remount(vol));
}

#[test]
fn changes_that_leave_contents_and_owner_alone_keep_the_capability() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = capable_file(&vol, b"f");
    // chmod, times, an empty write, a read.
    let chmod = SetAttr {
        mode: Some(0o755),
        ..Default::default()
    };
    vol.setattr(R, f, &chmod, SizeRight::Permission).unwrap();
    let times = SetAttr {
        mtime: Some(SetTime::Now),
        ..Default::default()
    };
    vol.setattr(R, f, &times, SizeRight::Permission).unwrap();
    assert_eq!(vol.write(R, f, 0, b"").unwrap(), 0);
    let mut buf = [0u8; 7];
    vol.read(f, 0, &mut buf).unwrap();
    assert!(has_cap(&vol, f));
    // Refused changes take nothing: a write past the largest file, a truncate beyond
    // it, a user's truncate by name without write permission.
    assert!(vol.write(R, f, max_file_size(), b"x").is_err());
    assert!(vol.truncate(R, f, max_file_size() + 1).is_err());
    let private = SetAttr {
        mode: Some(0o700),
        ..Default::default()
    };
    vol.setattr(R, f, &private, SizeRight::Permission).unwrap();
    let size = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    assert!(vol
        .setattr(&user(), f, &size, SizeRight::Permission)
        .is_err());
    assert!(has_cap(&vol, f), "a refused change took the capability");
    assert_fsck_clean(&remount(vol));
}

/// Review 31b: the capability goes where the write commits, under the same lock, so
/// one set while a write's bytes were still arriving (a reservation held across a
/// slow peer's payload, a layer-2 landing) goes with that write, as setcap and write
/// are ordered by the inode lock on Linux.
#[test]
fn a_capability_set_while_a_write_is_reserved_goes_with_the_write() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = capable_file(&vol, b"f");
    vol.removexattr(R, f, CAPABILITY_XATTR).unwrap();
    let mut r = vol.reserve_write(&user(), f, 0, 5).unwrap();
    vol.setxattr(R, f, CAPABILITY_XATTR, &cap(), XattrMode::Any)
        .unwrap();
    r.fill_from(b"hello");
    r.commit().unwrap();
    assert!(
        !has_cap(&vol, f),
        "the write committed after setcap kept it"
    );
    // Nothing changes, nothing goes: a pfree of no bytes.
    vol.setxattr(R, f, CAPABILITY_XATTR, &cap(), XattrMode::Any)
        .unwrap();
    vol.pfree(R, f, 0, 0).unwrap();
    assert!(has_cap(&vol, f));
    // A punch of a whole block takes it.
    vol.write(R, f, 0, &[7; 8192]).unwrap();
    vol.setxattr(R, f, CAPABILITY_XATTR, &cap(), XattrMode::Any)
        .unwrap();
    vol.pfree(R, f, 0, 4096).unwrap();
    assert!(!has_cap(&vol, f));
    assert_fsck_clean(&remount(vol));
}

/// Review 31d: a page placement refused because its set is larger than one log entry
/// (checked by `reserve_log`) is refused before anything changes, the capability too.
#[test]
fn a_pflush_refused_as_too_large_keeps_the_capability() {
    let mkfs = mkfs_with(64, 16 << 10);
    let vol = memory_volume_with(32 << 20, &mkfs, VolumeConfig::synchronous());
    let f = capable_file(&vol, b"f");
    let mut t = PflushTxn::default();
    let pages = vol.reserve_pages(2000).unwrap();
    t.pflush_add(f, 0, pages, None).unwrap();
    let r = vol.pflush_commit(t);
    assert!(
        matches!(r, Err(FsError::TransactionTooLarge { .. })),
        "{:?}",
        r.err()
    );
    assert!(has_cap(&vol, f), "a refused pflush took the capability");
    assert_fsck_clean(&remount(vol));
}

#[test]
fn a_writer_may_remove_the_capability_and_no_one_else_but_root() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = capable_file(&vol, b"f");
    let private = SetAttr {
        mode: Some(0o644),
        ..Default::default()
    };
    vol.setattr(R, f, &private, SizeRight::Permission).unwrap();
    // May not write it: may not remove it, nor set one.
    let e = vol.removexattr(&user(), f, CAPABILITY_XATTR).unwrap_err();
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    let e = vol
        .setxattr(&user(), f, CAPABILITY_XATTR, &cap(), XattrMode::Any)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    assert!(has_cap(&vol, f));
    // May write it: may remove it (what a write would do), still not set one.
    let writable = SetAttr {
        mode: Some(0o666),
        ..Default::default()
    };
    vol.setattr(R, f, &writable, SizeRight::Permission).unwrap();
    vol.removexattr(&user(), f, CAPABILITY_XATTR).unwrap();
    assert!(!has_cap(&vol, f));
    let e = vol.removexattr(&user(), f, CAPABILITY_XATTR).unwrap_err();
    assert_eq!(e.errno(), libc::ENODATA, "{e}");
    let e = vol
        .setxattr(&user(), f, CAPABILITY_XATTR, &cap(), XattrMode::Any)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    // Other security names stay root's to remove, writable file or not.
    vol.setxattr(R, f, b"security.other", b"v", XattrMode::Any)
        .unwrap();
    let e = vol.removexattr(&user(), f, b"security.other").unwrap_err();
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    assert_fsck_clean(&remount(vol));
}
