//! Adversarial review of POSIX ACLs (issue 14) in the volume: what a caller the kernel
//! did not check (a remote client speaking the protocol, a mount without the kernel's
//! checks) can make the ACL code do, and whether a refused ACL change leaves nothing
//! behind.

mod common;
use common::*;
use zcfs_volume::acl::{ACCESS_XATTR, DEFAULT_XATTR, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
use zcfs_volume::mode::*;
use zcfs_volume::*;

const R: &Cred = &Cred::ROOT;

fn alice() -> Cred {
    Cred::new(1000, 1000, vec![])
}

/// An ACL xattr value of these (tag, perm, id) entries.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut b = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&perm.to_le_bytes());
        let id = if tag == USER || tag == 0x08 {
            id
        } else {
            u32::MAX
        };
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

/// user::rw-, user:1001:rw-, group::r--, mask::rw-, other::---
fn named_acl() -> Vec<u8> {
    acl(&[
        (USER_OBJ, 6, 0),
        (USER, 6, 1001),
        (GROUP_OBJ, 4, 0),
        (MASK, 6, 0),
        (OTHER, 0, 0),
    ])
}

/// An ACL with `n` named user entries (all r--), mask r--.
fn acl_with_named(n: u32) -> Vec<u8> {
    let mut e = vec![(USER_OBJ, 7, 0)];
    e.extend((0..n).map(|i| (USER, 4, 2000 + i)));
    e.extend([(GROUP_OBJ, 5, 0), (MASK, 5, 0), (OTHER, 5, 0)]);
    acl(&e)
}

fn errno<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    r.expect_err("the operation should have been refused")
        .errno()
}

/// Runs `f`, which must fail with `want`, and checks the volume (tree and free
/// blocks) is as it was and still takes changes.
fn refused<T: std::fmt::Debug>(vol: &Volume, want: i32, f: impl FnOnce() -> Result<T>) {
    let before = dump_volume(vol).unwrap();
    let free = vol.statfs().bfree;
    assert_eq!(errno(f()), want, "errno");
    assert_eq!(
        dump_volume(vol).unwrap(),
        before,
        "a refused operation changed the volume"
    );
    assert_eq!(
        vol.statfs().bfree,
        free,
        "a refused operation leaked blocks"
    );
    vol.mkdir(R, ROOT_INO, b"still-works", 0o755).unwrap();
    vol.rmdir(R, ROOT_INO, b"still-works").unwrap();
}

/// A setattr that changes the mode of an inode with an access ACL (so the ACL is
/// rewritten, a block reserved for it) and a size the truncate refuses: the refusal
/// must undo the ACL's reservation. It used to drop a transaction holding a block,
/// which panics with the volume's lock held (every later operation fails) -- reachable
/// by a remote client's Setattr, and locally by an owner truncating their own
/// set-user-ID file (the kernel sends ATTR_KILL_SUID as a mode change with the size).
#[test]
fn chmod_with_a_refused_truncate_of_an_acl_inode_changes_nothing() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let f = vol
        .create(R, ROOT_INO, b"f", S_IFREG | 0o640, 0)
        .unwrap()
        .ino;
    vol.setxattr(R, f, ACCESS_XATTR, &named_acl(), XattrMode::Any)
        .unwrap();
    let d = vol.mkdir(R, ROOT_INO, b"d", 0o750).unwrap().ino;
    vol.setxattr(R, d, ACCESS_XATTR, &named_acl(), XattrMode::Any)
        .unwrap();
    let too_big = SetAttr {
        mode: Some(0o600),
        size: Some(max_file_size() + 1),
        ..Default::default()
    };
    refused(&vol, libc::EFBIG, || {
        vol.setattr(R, f, &too_big, SizeRight::Permission)
    });
    let dir_size = SetAttr {
        mode: Some(0o700),
        size: Some(0),
        ..Default::default()
    };
    refused(&vol, libc::EISDIR, || {
        vol.setattr(R, d, &dir_size, SizeRight::Permission)
    });
}

/// Linux keeps no ACL on a symbolic link (its inode operations have no set_acl:
/// EOPNOTSUPP), and a link's mode stays 0777. A caller the kernel did not check (a
/// remote client) must not be able to set one, nor change the link's mode with it.
#[test]
fn an_acl_on_a_symlink_is_refused() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let l = vol.symlink(R, ROOT_INO, b"l", b"target").unwrap().ino;
    let restrictive = acl(&[(USER_OBJ, 0, 0), (GROUP_OBJ, 0, 0), (OTHER, 0, 0)]);
    refused(&vol, libc::EOPNOTSUPP, || {
        vol.setxattr(R, l, ACCESS_XATTR, &named_acl(), XattrMode::Any)
    });
    refused(&vol, libc::EOPNOTSUPP, || {
        vol.setxattr(R, l, ACCESS_XATTR, &restrictive, XattrMode::Any)
    });
    refused(&vol, libc::EOPNOTSUPP, || {
        vol.removexattr(R, l, ACCESS_XATTR)
    });
    refused(&vol, libc::EOPNOTSUPP, || {
        vol.setxattr(&alice(), l, DEFAULT_XATTR, &named_acl(), XattrMode::Any)
    });
    assert_eq!(vol.getattr(l).unwrap().mode & 0o7777, 0o777);
}

/// A directory whose default ACL fills most of a block: a subdirectory made in it
/// stores that default ACL and an access ACL of the same size. With multi-block xattr
/// sets it is made, as on tmpfs (with one block per set it was refused with ENOSPC);
/// so is one under the largest ACL the kernel's FUSE client carries (511 entries).
#[test]
fn mkdir_under_a_large_default_acl_inherits_it() {
    let vol = memory_volume(8 << 20, VolumeConfig::synchronous());
    let d = vol.mkdir(R, ROOT_INO, b"d", 0o777).unwrap().ino;
    for named in [300, zcfs_volume::acl::MAX_ENTRIES as u32 - 4] {
        let big = acl_with_named(named);
        vol.setxattr(R, d, DEFAULT_XATTR, &big, XattrMode::Any)
            .unwrap();
        let name = format!("sub{named}");
        let sub = vol.mkdir(&alice(), d, name.as_bytes(), 0o777).unwrap();
        assert_eq!(vol.getxattr(R, sub.ino, DEFAULT_XATTR).unwrap(), big);
        assert!(vol.getxattr(R, sub.ino, ACCESS_XATTR).is_ok());
        let f = vol
            .create(
                &alice(),
                d,
                format!("f{named}").as_bytes(),
                S_IFREG | 0o666,
                0,
            )
            .unwrap();
        assert!(vol.getxattr(R, f.ino, ACCESS_XATTR).is_ok());
    }
    let r = zcfs_volume::fsck::check_volume(&vol);
    assert!(r.is_clean(), "{:?}", r.problems);
}

/// chmod of a file with an access ACL rewrites the ACL into a fresh xattr block; on a
/// full volume that used to fail with ENOSPC -- also a chmod go-rwx meant to close a
/// file, which then stayed open to the ACL's named users. tmpfs (and ext4, which
/// rewrites the xattr in place) take the chmod; so does zcfs now, from the metadata
/// reserve (`METADATA_RESERVE_MAX`), and the reserve comes back with the old block.
#[test]
fn chmod_of_an_acl_file_succeeds_on_a_full_volume() {
    let vol = memory_volume(2 << 20, VolumeConfig::synchronous());
    let f = vol
        .create(R, ROOT_INO, b"f", S_IFREG | 0o660, 0)
        .unwrap()
        .ino;
    vol.setxattr(R, f, ACCESS_XATTR, &named_acl(), XattrMode::Any)
        .unwrap();
    let fill = vol
        .create(R, ROOT_INO, b"fill", S_IFREG | 0o600, 0)
        .unwrap()
        .ino;
    let chunk = vec![7u8; 64 << 10];
    let mut off = 0u64;
    // Bounded: the volume is 2 MiB.
    for _ in 0..1024 {
        match vol.write(R, fill, off, &chunk) {
            Ok(n) if n > 0 => off += n as u64,
            _ => break,
        }
    }
    // The last few blocks, one at a time.
    for _ in 0..1024 {
        match vol.write(R, fill, off, &chunk[..BLOCK]) {
            Ok(n) if n > 0 => off += n as u64,
            _ => break,
        }
    }
    assert_eq!(vol.statfs().bfree, 0, "the volume is full");
    let close = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    vol.setattr(R, f, &close, SizeRight::Permission)
        .expect("chmod on a full volume");
    let bob = Cred::new(1001, 1001, vec![]);
    assert_eq!(errno(vol.access(&bob, f, 4)), libc::EACCES);
    // Again and again: each rewrite gives back what it took.
    for m in [0o640, 0o600, 0o660, 0o600] {
        let chmod = SetAttr {
            mode: Some(m),
            ..Default::default()
        };
        vol.setattr(R, f, &chmod, SizeRight::Permission)
            .expect("chmod on a full volume, repeated");
    }
    // Removing the ACL works too and frees its block, which data may then take; the
    // reserve it may not.
    vol.removexattr(R, f, ACCESS_XATTR).unwrap();
    assert_eq!(vol.statfs().bfree, 1);
    assert_eq!(vol.write(R, fill, off, &chunk[..BLOCK]).unwrap(), BLOCK);
    off += BLOCK as u64;
    assert_eq!(
        errno(vol.write(R, fill, off, &chunk[..BLOCK])),
        libc::ENOSPC
    );
    assert_eq!(vol.statfs().bfree, 0);
    let r = zcfs_volume::fsck::check_volume(&vol);
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn the_metadata_reserve_is_bounded_and_hidden_from_statfs() {
    use zcfs_volume::{metadata_reserve, METADATA_RESERVE_MAX};
    assert_eq!(
        metadata_reserve(16 * METADATA_RESERVE_MAX),
        METADATA_RESERVE_MAX
    );
    assert_eq!(
        metadata_reserve(16 * METADATA_RESERVE_MAX - 1),
        METADATA_RESERVE_MAX - 1
    );
    assert_eq!(metadata_reserve(16), 1);
    assert_eq!(metadata_reserve(1 << 30), METADATA_RESERVE_MAX);
    assert_eq!(metadata_reserve(15), 0);
    let vol = memory_volume(2 << 20, VolumeConfig::synchronous());
    let s = vol.statfs();
    let used_by_root = s.blocks - s.bfree;
    // A fresh volume: the root directory's blocks plus the reserve (1/16 of this
    // small volume's data area).
    let reserve = metadata_reserve(s.blocks);
    assert!(reserve > 0 && reserve <= METADATA_RESERVE_MAX);
    assert!(used_by_root >= reserve, "{used_by_root}");
}

/// Rewrites that dip into the metadata reserve in one batch (their old blocks are
/// deferred frees until a checkpoint) break neither fallocate's promise nor the
/// reserve: the preallocated overwrites all succeed afterwards, and ordinary writes
/// still get nothing.
#[test]
fn rewrites_from_the_reserve_in_a_batch_keep_fallocate_promise() {
    let vol = memory_volume(2 << 20, VolumeConfig::default());
    let f = vol
        .create(R, ROOT_INO, b"f", S_IFREG | 0o660, 0)
        .unwrap()
        .ino;
    vol.setxattr(R, f, ACCESS_XATTR, &named_acl(), XattrMode::Any)
        .unwrap();
    let p = vol
        .create(R, ROOT_INO, b"p", S_IFREG | 0o600, 0)
        .unwrap()
        .ino;
    const PRE: u64 = 8;
    vol.fallocate(
        R,
        p,
        0,
        PRE * BLOCK as u64,
        FallocMode::Allocate { keep_size: false },
    )
    .unwrap();
    let fill = vol
        .create(R, ROOT_INO, b"fill", S_IFREG | 0o600, 0)
        .unwrap()
        .ino;
    let mut off = 0u64;
    for _ in 0..2048 {
        match vol.write(R, fill, off, &[7u8; BLOCK]) {
            Ok(n) if n > 0 => off += n as u64,
            _ => break,
        }
    }
    assert_eq!(vol.statfs().bfree, 0, "the volume is full");
    for m in (0..40).map(|i| if i % 2 == 0 { 0o640 } else { 0o660 }) {
        let chmod = SetAttr {
            mode: Some(m),
            ..Default::default()
        };
        vol.setattr(R, f, &chmod, SizeRight::Permission)
            .expect("chmod on a full volume, batched");
    }
    for b in 0..PRE {
        assert_eq!(
            vol.write(R, p, b * BLOCK as u64, &[9u8; BLOCK]).unwrap(),
            BLOCK,
            "preallocated block {b}"
        );
    }
    // The promise is spent: the replaced blocks are ordinary free space now, and no more.
    for _ in 0..PRE {
        assert_eq!(vol.write(R, fill, off, &[7u8; BLOCK]).unwrap(), BLOCK);
        off += BLOCK as u64;
    }
    assert_eq!(errno(vol.write(R, fill, off, &[7u8; BLOCK])), libc::ENOSPC);
    vol.checkpoint_now().unwrap();
    assert_eq!(vol.statfs().bfree, 0);
    let r = zcfs_volume::fsck::check_volume(&vol);
    assert!(r.is_clean(), "{:?}", r.problems);
}
