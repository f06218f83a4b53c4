//! Authorization in the volume (issue 10): every operation checks the caller's
//! credentials against the inodes it touches, under the lock that the change takes, and
//! a refused operation changes nothing.

mod common;
use common::*;
use zcfs_volume::mode::*;
use zcfs_volume::*;

const R: &Cred = &Cred::ROOT;

fn alice() -> Cred {
    Cred::new(1000, 1000, vec![])
}
fn bob() -> Cred {
    Cred::new(1001, 1001, vec![])
}
fn bob_in_alices_group() -> Cred {
    Cred::new(1001, 1001, vec![1000])
}

/// A volume with /home (0755 root), /home/alice (0700 alice), /tmp (1777 root),
/// /pub (0777 root).
fn tree() -> std::sync::Arc<Volume> {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let home = vol.mkdir(R, ROOT_INO, b"home", 0o755).unwrap().ino;
    let a = vol.mkdir(R, home, b"alice", 0o700).unwrap().ino;
    let own = SetAttr {
        uid: Some(1000),
        gid: Some(1000),
        ..Default::default()
    };
    vol.setattr(R, a, &own, SizeRight::Permission).unwrap();
    vol.mkdir(R, ROOT_INO, b"tmp", 0o1777).unwrap();
    vol.mkdir(R, ROOT_INO, b"pub", 0o777).unwrap();
    vol
}

fn ino(vol: &Volume, path: &[&[u8]]) -> u64 {
    let mut at = ROOT_INO;
    for n in path {
        at = vol.lookup(R, at, n).unwrap().ino;
    }
    at
}

fn errno<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    r.expect_err("the operation should have been refused")
        .errno()
}

/// Runs `f`, which must fail with `want`, and checks the volume is as it was.
fn refused<T: std::fmt::Debug>(vol: &Volume, want: i32, f: impl FnOnce() -> Result<T>) {
    let before = dump_volume(vol).unwrap();
    assert_eq!(errno(f()), want, "errno");
    assert_eq!(
        dump_volume(vol).unwrap(),
        before,
        "a refused operation changed the volume"
    );
}

#[test]
fn search_permission_on_every_directory_of_a_lookup() {
    let vol = tree();
    let home = ino(&vol, &[b"home"]);
    let a = ino(&vol, &[b"home", b"alice"]);
    vol.create(&alice(), a, b"secret", 0o600, 0).unwrap();
    assert_eq!(errno(vol.lookup(&bob(), a, b"secret")), libc::EACCES);
    assert_eq!(
        errno(vol.lookup(&bob(), a, b"missing")),
        libc::EACCES,
        "before ENOENT"
    );
    assert!(vol.lookup(&alice(), a, b"secret").is_ok());
    assert!(vol.lookup(R, a, b"secret").is_ok());
    assert!(vol.lookup(&bob(), home, b"alice").is_ok());
    assert_eq!(errno(vol.parent_of(&bob(), a)), libc::EACCES);
}

#[test]
fn creating_and_removing_names_needs_write_and_search_on_the_directory() {
    let vol = tree();
    let home = ino(&vol, &[b"home"]);
    let a = ino(&vol, &[b"home", b"alice"]);
    refused(&vol, libc::EACCES, || {
        vol.create(&bob(), home, b"x", 0o644, 0)
    });
    refused(&vol, libc::EACCES, || vol.mkdir(&bob(), a, b"x", 0o755));
    refused(&vol, libc::EACCES, || vol.symlink(&bob(), home, b"x", b"t"));
    // EEXIST comes before the permission check (as Linux's may_create).
    assert_eq!(
        errno(vol.mkdir(&bob(), home, b"alice", 0o755)),
        libc::EEXIST
    );
    let f = vol.create(&alice(), a, b"f", 0o644, 0).unwrap();
    assert_eq!((f.uid, f.gid), (1000, 1000));
    refused(&vol, libc::EACCES, || vol.unlink(&bob(), a, b"f"));
    // Another's file bob may not write: protected_hardlinks refuses before the
    // directory is checked; a file he may read and write reaches the directory check.
    refused(&vol, libc::EPERM, || vol.link(&bob(), f.ino, home, b"l"));
    let pubd = ino(&vol, &[b"pub"]);
    let open = vol.create(&alice(), pubd, b"open", 0o666, 0).unwrap();
    refused(&vol, libc::EACCES, || {
        vol.link(&bob(), open.ino, home, b"l")
    });
    vol.link(&bob(), open.ino, pubd, b"l").unwrap();
    refused(&vol, libc::EACCES, || {
        vol.rename(&bob(), a, b"f", home, b"g", RenameFlags::default())
    });
    vol.unlink(&alice(), a, b"f").unwrap();
}

#[test]
fn sticky_directories_keep_others_from_removing_or_replacing_entries() {
    let vol = tree();
    let tmp = ino(&vol, &[b"tmp"]);
    vol.create(&alice(), tmp, b"a", 0o666, 0).unwrap();
    vol.create(&bob(), tmp, b"b", 0o666, 0).unwrap();
    refused(&vol, libc::EPERM, || vol.unlink(&bob(), tmp, b"a"));
    let none = RenameFlags::default();
    refused(&vol, libc::EPERM, || {
        vol.rename(&bob(), tmp, b"a", tmp, b"c", none)
    });
    // Replacing alice's entry is removing it.
    refused(&vol, libc::EPERM, || {
        vol.rename(&bob(), tmp, b"b", tmp, b"a", none)
    });
    let exchange = RenameFlags {
        exchange: true,
        ..Default::default()
    };
    refused(&vol, libc::EPERM, || {
        vol.rename(&bob(), tmp, b"b", tmp, b"a", exchange)
    });
    vol.rename(&bob(), tmp, b"b", tmp, b"b2", none).unwrap();
    vol.unlink(&alice(), tmp, b"a").unwrap();
    vol.unlink(R, tmp, b"b2").unwrap();
}

#[test]
fn moving_a_directory_to_another_parent_needs_write_permission_on_it() {
    let vol = tree();
    let pubd = ino(&vol, &[b"pub"]);
    let tmp = ino(&vol, &[b"tmp"]);
    let d = vol.mkdir(R, pubd, b"rootdir", 0o755).unwrap();
    let none = RenameFlags::default();
    // Its ".." changes: bob may not write to it.
    refused(&vol, libc::EACCES, || {
        vol.rename(&bob(), pubd, b"rootdir", tmp, b"d", none)
    });
    // Within the same parent ".." stays.
    vol.rename(&bob(), pubd, b"rootdir", pubd, b"renamed", none)
        .unwrap();
    assert_eq!(vol.lookup(R, pubd, b"renamed").unwrap().ino, d.ino);
}

#[test]
fn chmod_chown_and_times_follow_the_owner_rules() {
    let vol = tree();
    let pubd = ino(&vol, &[b"pub"]);
    let f = vol.create(&alice(), pubd, b"f", 0o644, 0).unwrap().ino;
    let set = |f: &dyn Fn(&mut SetAttr)| {
        let mut s = SetAttr::default();
        f(&mut s);
        s
    };
    let p = SizeRight::Permission;
    let chmod = set(&|s| s.mode = Some(0o4755));
    refused(&vol, libc::EPERM, || vol.setattr(&bob(), f, &chmod, p));
    let give = set(&|s| s.uid = Some(1001));
    refused(&vol, libc::EPERM, || vol.setattr(&alice(), f, &give, p));
    let chgrp = set(&|s| s.gid = Some(1001));
    refused(&vol, libc::EPERM, || vol.setattr(&alice(), f, &chgrp, p));
    let truncate = set(&|s| s.size = Some(0));
    refused(&vol, libc::EACCES, || vol.setattr(&bob(), f, &truncate, p));
    let at = set(&|s| s.mtime = Some(SetTime::At(Time { sec: 5, nsec: 0 })));
    refused(&vol, libc::EPERM, || vol.setattr(&bob(), f, &at, p));
    let now = set(&|s| s.mtime = Some(SetTime::Now));
    refused(&vol, libc::EACCES, || vol.setattr(&bob(), f, &now, p));
    // The owner may; a truncate through a handle needs no write bit here.
    assert_eq!(
        vol.setattr(&alice(), f, &chmod, p).unwrap().mode,
        S_IFREG | 0o4755
    );
    vol.setattr(&bob(), f, &truncate, SizeRight::WritableHandle)
        .unwrap();
    // ... and dropped the set-user-ID bit, as any unprivileged truncate does.
    assert_eq!(vol.getattr(f).unwrap().mode, S_IFREG | 0o755);
    // chgrp to a group the owner is in; the set-group-ID bit a non-member sets is dropped.
    let alice_in_7 = Cred::new(1000, 1000, vec![7]);
    let to7 = set(&|s| s.gid = Some(7));
    assert_eq!(vol.setattr(&alice_in_7, f, &to7, p).unwrap().gid, 7);
    let sgid = set(&|s| s.mode = Some(0o2755));
    assert_eq!(
        vol.setattr(&alice(), f, &sgid, p).unwrap().mode,
        S_IFREG | 0o755
    );
    assert_eq!(
        vol.setattr(&alice_in_7, f, &sgid, p).unwrap().mode,
        S_IFREG | 0o2755
    );
    // Root's chown drops both bits of a file.
    let chown = set(&|s| s.uid = Some(1001));
    let a = vol.setattr(R, f, &chown, p).unwrap();
    assert_eq!((a.uid, a.mode), (1001, S_IFREG | 0o755));
}

#[test]
fn writes_by_users_drop_set_id_bits_and_roots_do_not() {
    let vol = tree();
    let pubd = ino(&vol, &[b"pub"]);
    let f = vol.create(R, pubd, b"prog", 0o6777, 0).unwrap().ino;
    vol.write(R, f, 0, b"root").unwrap();
    assert_eq!(vol.getattr(f).unwrap().mode, S_IFREG | 0o6777);
    vol.write(&bob(), f, 0, b"bob").unwrap();
    assert_eq!(vol.getattr(f).unwrap().mode, S_IFREG | 0o777);
    // Through a reservation (the server's zero-copy path) too.
    let g = vol.create(R, pubd, b"prog2", 0o4755, 0).unwrap().ino;
    let mut r = vol.reserve_write(&bob(), g, 0, 3).unwrap();
    r.fill_from(b"abc");
    r.commit().unwrap();
    assert_eq!(vol.getattr(g).unwrap().mode, S_IFREG | 0o755);
    // A group member keeps a set-group-ID bit without group execute; others do not.
    let h = vol.create(R, pubd, b"locked", 0o2666, 0).unwrap().ino;
    let to_alice = SetAttr {
        gid: Some(1000),
        ..Default::default()
    };
    vol.setattr(R, h, &to_alice, SizeRight::Permission).unwrap();
    vol.setattr(
        R,
        h,
        &SetAttr {
            mode: Some(0o2666),
            ..Default::default()
        },
        SizeRight::Permission,
    )
    .unwrap();
    vol.write(&bob_in_alices_group(), h, 0, b"x").unwrap();
    assert_eq!(vol.getattr(h).unwrap().mode, S_IFREG | 0o2666);
    vol.write(&bob(), h, 0, b"y").unwrap();
    assert_eq!(vol.getattr(h).unwrap().mode, S_IFREG | 0o666);
    // truncate(2) through a handle, by a user.
    let k = vol.create(R, pubd, b"k", 0o4777, 0).unwrap().ino;
    vol.truncate(&bob(), k, 0).unwrap();
    assert_eq!(vol.getattr(k).unwrap().mode, S_IFREG | 0o777);
}

#[test]
fn new_files_in_a_setgid_directory_take_its_group() {
    let vol = tree();
    let pubd = ino(&vol, &[b"pub"]);
    let shared = vol.mkdir(R, pubd, b"shared", 0o2777).unwrap().ino;
    let grp = SetAttr {
        gid: Some(50),
        ..Default::default()
    };
    vol.setattr(R, shared, &grp, SizeRight::Permission).unwrap();
    let f = vol.create(&bob(), shared, b"f", 0o2755, 0).unwrap();
    assert_eq!(
        (f.uid, f.gid, f.mode),
        (1001, 50, S_IFREG | 0o755),
        "not in group 50"
    );
    let d = vol.mkdir(&bob(), shared, b"d", 0o755).unwrap();
    assert_eq!(
        (d.gid, d.mode),
        (50, S_IFDIR | 0o2755),
        "subdirectories inherit"
    );
}

#[test]
fn access_and_extended_attributes() {
    let vol = tree();
    let pubd = ino(&vol, &[b"pub"]);
    let f = vol.create(&alice(), pubd, b"f", 0o640, 0).unwrap().ino;
    use zcfs_volume::perm::{MAY_EXEC, MAY_READ, MAY_WRITE};
    assert!(vol.access(&alice(), f, MAY_READ | MAY_WRITE).is_ok());
    assert_eq!(errno(vol.access(&alice(), f, MAY_EXEC)), libc::EACCES);
    assert_eq!(errno(vol.access(&bob(), f, MAY_READ)), libc::EACCES);
    assert!(vol.access(&bob_in_alices_group(), f, MAY_READ).is_ok());
    assert!(vol.access(&bob(), f, 0).is_ok(), "F_OK");
    assert_eq!(
        errno(vol.access(R, f, MAY_EXEC)),
        libc::EACCES,
        "no x bit at all"
    );
    vol.setxattr(&alice(), f, b"user.k", b"v", XattrMode::Any)
        .unwrap();
    assert_eq!(errno(vol.getxattr(&bob(), f, b"user.k")), libc::EACCES);
    refused(&vol, libc::EACCES, || {
        vol.setxattr(&bob_in_alices_group(), f, b"user.k", b"w", XattrMode::Any)
    });
    refused(&vol, libc::EACCES, || vol.removexattr(&bob(), f, b"user.k"));
    refused(&vol, libc::EPERM, || {
        vol.setxattr(&alice(), f, b"trusted.k", b"v", XattrMode::Any)
    });
    vol.setxattr(R, f, b"trusted.k", b"v", XattrMode::Any)
        .unwrap();
    assert_eq!(
        vol.listxattr(&alice(), f).unwrap(),
        vec![b"user.k".to_vec()]
    );
    assert_eq!(vol.listxattr(R, f).unwrap().len(), 2);
    // A credential a trusted party checked already is not checked again.
    assert!(vol
        .getxattr(&Cred::checked(1001, 1001), f, b"user.k")
        .is_ok());
}
