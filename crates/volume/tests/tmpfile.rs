//! O_TMPFILE in the volume: a file with link count 0 held by its opener's reference,
//! linkable once unless made with O_EXCL, freed with its last reference or, after a
//! crash, by the next open; failures change nothing.

mod common;
use common::*;
use std::sync::Arc;
use zcfs_pmem::crash::{for_each_crash_image, CrashConfig};
use zcfs_volume::*;

fn sync_volume() -> Arc<Volume> {
    memory_volume(4 << 20, VolumeConfig::synchronous())
}

fn alice() -> Cred {
    Cred::new(1001, 1001, Vec::new())
}

#[test]
fn a_tmpfile_is_an_orphan_held_by_its_opener_and_freed_with_it() {
    let vol = sync_volume();
    let free = vol.statfs();
    let a = vol
        .tmpfile_held(&with_umask(Cred::ROOT, 0o022), ROOT_INO, 0o100644, true)
        .unwrap();
    assert_eq!((a.nlink, a.mode, a.uid, a.gid), (0, 0o100644, 0, 0));
    assert_eq!(vol.references(a.ino), 1);
    assert_eq!(vol.dir_len(ROOT_INO).unwrap(), 0, "no directory names it");
    assert_eq!(
        vol.write(&Cred::ROOT, a.ino, 0, &[5; 10_000]).unwrap(),
        10_000
    );
    assert_eq!(vol.statfs().ffree, free.ffree - 1);
    assert!(vol.statfs().bfree < free.bfree);
    assert_fsck_clean(&vol);
    vol.forget(a.ino, 1).unwrap();
    assert!(matches!(vol.getattr(a.ino), Err(FsError::Stale)));
    assert_eq!(vol.statfs(), free, "its inode and blocks came back");
    assert_fsck_clean(&vol);
}

#[test]
fn only_a_linkable_tmpfile_takes_a_name_and_only_its_first() {
    let vol = sync_volume();
    // Linkable: its first link works, the link count becomes 1.
    let a = vol
        .tmpfile_held(&Cred::ROOT, ROOT_INO, 0o600, true)
        .unwrap();
    vol.write(&Cred::ROOT, a.ino, 0, b"data").unwrap();
    assert_eq!(
        vol.link(&Cred::ROOT, a.ino, ROOT_INO, b"a").unwrap().nlink,
        1
    );
    assert_eq!(vol.lookup(&Cred::ROOT, ROOT_INO, b"a").unwrap().ino, a.ino);
    // Unlinked again (still open), it takes no new name: I_LINKABLE went with the link.
    vol.unlink(&Cred::ROOT, ROOT_INO, b"a").unwrap();
    assert_eq!(vol.getattr(a.ino).unwrap().nlink, 0);
    assert!(matches!(
        vol.link(&Cred::ROOT, a.ino, ROOT_INO, b"again"),
        Err(FsError::NotFound)
    ));
    // O_EXCL: never.
    let x = vol
        .tmpfile_held(&Cred::ROOT, ROOT_INO, 0o600, false)
        .unwrap();
    assert!(matches!(
        vol.link(&Cred::ROOT, x.ino, ROOT_INO, b"x"),
        Err(FsError::NotFound)
    ));
    // A file unlinked while open: never (as before).
    let f = new_file(&vol, ROOT_INO, b"f");
    vol.open_handle(f).unwrap();
    vol.unlink(&Cred::ROOT, ROOT_INO, b"f").unwrap();
    assert!(matches!(
        vol.link(&Cred::ROOT, f, ROOT_INO, b"f2"),
        Err(FsError::NotFound)
    ));
    assert_eq!(vol.dir_len(ROOT_INO).unwrap(), 0);
    for ino in [a.ino, x.ino, f] {
        vol.forget(ino, 1).unwrap();
    }
    assert_eq!(vol.statfs().ffree, vol.statfs().files - 1);
    assert_fsck_clean(&vol);
}

#[test]
fn a_tmpfile_has_the_permission_checks_owner_and_group_of_create() {
    let vol = sync_volume();
    let root_dir = vol.mkdir(&Cred::ROOT, ROOT_INO, b"r", 0o755).unwrap().ino;
    let before = vol.statfs();
    // Write and search permission on the directory.
    assert!(matches!(
        vol.tmpfile_held(&alice(), root_dir, 0o600, true),
        Err(FsError::AccessDenied(_))
    ));
    // Not a directory; not a regular file's mode.
    let f = new_file(&vol, ROOT_INO, b"f");
    assert!(matches!(
        vol.tmpfile_held(&Cred::ROOT, f, 0o600, true),
        Err(FsError::NotDir)
    ));
    assert!(matches!(
        vol.tmpfile_held(&Cred::ROOT, ROOT_INO, 0o040755, true),
        Err(FsError::Invalid(_))
    ));
    assert_eq!(vol.statfs().ffree, before.ffree - 1, "only f was made");
    // umask; the group of a setgid directory, and its set-group-ID bit dropped for a
    // creator outside that group.
    let sg = vol.mkdir(&Cred::ROOT, ROOT_INO, b"sg", 0o777).unwrap().ino;
    let set = SetAttr {
        mode: Some(0o2777),
        gid: Some(1234),
        ..Default::default()
    };
    vol.setattr(&Cred::ROOT, sg, &set, SizeRight::Permission)
        .unwrap();
    let a = vol
        .tmpfile_held(&with_umask(alice(), 0o022), sg, 0o2775, true)
        .unwrap();
    assert_eq!((a.mode, a.uid, a.gid), (0o100755, 1001, 1234));
    let b = vol
        .tmpfile_held(
            &with_umask(Cred::new(1002, 1002, vec![1234]), 0o077),
            sg,
            0o2775,
            true,
        )
        .unwrap();
    assert_eq!((b.mode, b.uid, b.gid), (0o102700, 1002, 1234));
    vol.forget(a.ino, 1).unwrap();
    vol.forget(b.ino, 1).unwrap();
    assert_fsck_clean(&vol);
}

/// What must not change when an operation fails.
fn snapshot(vol: &Volume) -> (Vec<String>, StatFs) {
    (dump_volume(vol).unwrap(), vol.statfs())
}

/// Every budget check of tmpfile and of a tmpfile's link fails in turn: the volume is
/// as before (tree, free blocks and inodes, references), fsck clean, and the operation
/// then succeeds.
#[test]
fn every_failing_check_of_tmpfile_and_its_link_changes_nothing() {
    let plan = Arc::new(FaultPlan::default());
    let cfg = VolumeConfig {
        faults: Some(plan.clone()),
        ..VolumeConfig::synchronous()
    };
    let vol = memory_volume(4 << 20, cfg);
    let mut injected = 0;
    for n in 1.. {
        let before = snapshot(&vol);
        plan.fail_nth(Some(n));
        let r = vol.tmpfile_held(&Cred::ROOT, ROOT_INO, 0o600, true);
        let seen = plan.seen();
        plan.fail_nth(None);
        let Err(e) = r else {
            assert!(seen < n, "check {n} failed but tmpfile succeeded");
            vol.forget(r.unwrap().ino, 1).unwrap();
            break;
        };
        assert_eq!(
            snapshot(&vol),
            before,
            "tmpfile check {n} ({e}) changed the state"
        );
        assert_fsck_clean(&vol);
        injected += 1;
    }
    let t = vol
        .tmpfile_held(&Cred::ROOT, ROOT_INO, 0o600, true)
        .unwrap();
    for n in 1.. {
        let before = snapshot(&vol);
        plan.fail_nth(Some(n));
        let r = vol.link(&Cred::ROOT, t.ino, ROOT_INO, b"t");
        let seen = plan.seen();
        plan.fail_nth(None);
        if r.is_ok() {
            assert!(seen < n, "check {n} failed but link succeeded");
            break;
        }
        assert_eq!(snapshot(&vol), before, "link check {n} changed the state");
        assert_fsck_clean(&vol);
        injected += 1;
    }
    assert_eq!(
        vol.getattr(t.ino).unwrap().nlink,
        1,
        "still linkable after failures"
    );
    assert!(injected >= 3, "too few checks injected: {injected}");
    // A full inode table: NoInodes, nothing changed.
    while vol.statfs().ffree > 0 {
        let n = vol.statfs().ffree;
        new_file(&vol, ROOT_INO, format!("i{n}").as_bytes());
    }
    let before = snapshot(&vol);
    assert!(matches!(
        vol.tmpfile_held(&Cred::ROOT, ROOT_INO, 0o600, true),
        Err(FsError::NoInodes)
    ));
    assert_eq!(snapshot(&vol), before);
    vol.forget(t.ino, 1).unwrap();
    assert_fsck_clean(&vol);
}

/// Crash at every fence of: a tmpfile written and linked, another written and left
/// unlinked. Every image recovers with no orphan left, fsck clean, and the linked one
/// either absent (crash before its link) or there with all its data.
#[test]
fn after_a_crash_unlinked_tmpfiles_are_reaped_and_linked_ones_survive() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    vol.checkpoint_now().unwrap();
    let files = vol.statfs().files;
    // SAFETY: this thread alone uses the volume while recording.
    unsafe { vol.test_door().start_recording() };
    let kept = vol
        .tmpfile_held(&Cred::ROOT, ROOT_INO, 0o644, true)
        .unwrap()
        .ino;
    vol.write(&Cred::ROOT, kept, 0, &[7; 6000]).unwrap();
    vol.link(&Cred::ROOT, kept, ROOT_INO, b"kept").unwrap();
    let lost = vol
        .tmpfile_held(&Cred::ROOT, ROOT_INO, 0o600, true)
        .unwrap()
        .ino;
    vol.write(&Cred::ROOT, lost, 0, &[8; 9000]).unwrap();
    vol.sync().unwrap();
    let rec = vol.test_door().take_recording().unwrap();
    vol.abandon();
    let (mut n, mut with_kept) = (0, 0);
    let mut bad = Vec::new();
    for_each_crash_image(&rec, &CrashConfig::default(), |pt, img| {
        n += 1;
        let v = Volume::open_region(Region::from_image(img), VolumeConfig::synchronous()).unwrap();
        v.abandon();
        let r = zcfs_volume::fsck::check_volume(&v);
        let used = files - v.statfs().ffree;
        let problem = match v.lookup(&Cred::ROOT, ROOT_INO, b"kept") {
            Ok(a) => {
                with_kept += 1;
                let mut buf = vec![0; 6001];
                let got = v.read(a.ino, 0, &mut buf).unwrap();
                (used != 2 || a.nlink != 1 || got != 6000 || buf[..6000] != [7; 6000])
                    .then(|| format!("kept: {used} inodes, nlink {}, {got} bytes", a.nlink))
            }
            Err(FsError::NotFound) => (used != 1).then(|| format!("{used} inodes used")),
            Err(e) => Some(format!("lookup: {e}")),
        };
        if !r.is_clean() || problem.is_some() {
            bad.push(format!("fence {}: {problem:?} {:?}", pt.fence, r.problems));
        }
        bad.len() < 5
    });
    println!(
        "tmpfile crash states: {n} ({with_kept} with the linked tmpfile), {} violations",
        bad.len()
    );
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(
        with_kept > 0 && with_kept < n,
        "both outcomes seen: {with_kept} of {n}"
    );
}

/// `cred` with the umask a process would have.
fn with_umask(mut cred: Cred, umask: u32) -> Cred {
    cred.umask = umask;
    cred
}

#[test]
fn a_tmpfile_inherits_its_directorys_default_acl_instead_of_the_umask() {
    let vol = sync_volume();
    let d = vol.mkdir(&Cred::ROOT, ROOT_INO, b"d", 0o777).unwrap();
    vol.setxattr(
        &Cred::ROOT,
        d.ino,
        DEFAULT.as_bytes(),
        &acl_value(0o7, 0o5),
        XattrMode::Any,
    )
    .unwrap();
    let a = vol
        .tmpfile_held(&with_umask(Cred::ROOT, 0o077), d.ino, 0o666, true)
        .unwrap();
    // posix_acl_create: the umask is ignored; mode 0666 limits owner, mask and other.
    assert_eq!(a.mode, 0o100644);
    let acl = vol.getxattr(&Cred::ROOT, a.ino, ACCESS.as_bytes()).unwrap();
    let parsed = zcfs_volume::acl::Acl::decode(&acl).unwrap();
    let perms: Vec<u16> = parsed.entries().iter().map(|e| e.perm).collect();
    assert_eq!(perms, [6, 5, 5, 4, 4]);
    assert!(vol
        .getxattr(&Cred::ROOT, a.ino, DEFAULT.as_bytes())
        .is_err());
    // Without a default ACL the umask applies.
    let b = vol
        .tmpfile_held(&with_umask(Cred::ROOT, 0o077), ROOT_INO, 0o666, true)
        .unwrap();
    assert_eq!(b.mode, 0o100600);
}
