//! Entry points shared by the cargo-fuzz targets and the stable fuzz tests: feed an
//! image (or a patched template image) through mount, fsck and a tree walk. Any input
//! may be rejected; none may panic.

use crate::{fsck, layout, Cred, MkfsOptions, Region, Volume, VolumeConfig, ROOT_INO};

/// A small valid volume with a few files, directories, links and xattrs: the starting
/// point for patch-based fuzzing, so mutations get past the checksums.
pub fn template_image() -> Vec<u8> {
    let mut region = Region::anonymous(256 << 10);
    Volume::mkfs_region(
        &mut region,
        &MkfsOptions {
            inodes: Some(32),
            log_bytes: Some(16 << 10),
            ..Default::default()
        },
    )
    .unwrap();
    let vol = Volume::open_region(
        region,
        VolumeConfig {
            batch_ops: 4,
            ..VolumeConfig::default()
        },
    )
    .unwrap();
    let d = vol.mkdir(&Cred::ROOT, ROOT_INO, b"dir", 0o755).unwrap();
    let f = vol.create(&Cred::ROOT, d.ino, b"file", 0o644, 0).unwrap();
    vol.write(&Cred::ROOT, f.ino, 100, &[7u8; 9000]).unwrap();
    vol.link(&Cred::ROOT, f.ino, ROOT_INO, b"hard").unwrap();
    vol.symlink(&Cred::ROOT, ROOT_INO, b"sym", b"dir/file")
        .unwrap();
    vol.setxattr(
        &Cred::ROOT,
        f.ino,
        b"user.x",
        b"value",
        crate::XattrMode::Any,
    )
    .unwrap();
    // ACLs, so image fuzzing reaches their decoding (access checks, inheritance).
    let acl = |entries: &[(u16, u16)]| {
        let mut v = 2u32.to_le_bytes().to_vec();
        for &(tag, perm) in entries {
            let id: u32 = if tag == crate::acl::USER {
                1000
            } else {
                u32::MAX
            };
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    };
    use crate::acl::{ACCESS_XATTR, DEFAULT_XATTR, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
    let entries = [
        (USER_OBJ, 6),
        (USER, 4),
        (GROUP_OBJ, 4),
        (MASK, 4),
        (OTHER, 0),
    ];
    for (ino, name) in [(f.ino, ACCESS_XATTR), (d.ino, DEFAULT_XATTR)] {
        vol.setxattr(
            &Cred::ROOT,
            ino,
            name,
            &acl(&entries),
            crate::XattrMode::Any,
        )
        .unwrap();
    }
    // A set too large for one block: the index form and its data blocks.
    vol.setxattr(
        &Cred::ROOT,
        d.ino,
        b"user.big",
        &[0x5a; 6000],
        crate::XattrMode::Any,
    )
    .unwrap();
    let g = vol
        .create(&Cred::ROOT, ROOT_INO, b"sparse", 0o600, 0)
        .unwrap();
    vol.write(&Cred::ROOT, g.ino, 3 << 20, b"far").unwrap();
    // Leave the last operations in the log (not checkpointed) so replay is exercised.
    vol.sync().unwrap();
    vol.create(&Cred::ROOT, d.ino, b"late", 0o644, 0).unwrap();
    vol.sync().unwrap();
    // SAFETY: no operation runs while copying.
    let img = unsafe { vol.test_door().image() };
    vol.abandon();
    img
}

/// Mount an arbitrary image, check it, walk it and try a few mutations.
pub fn exercise_image(img: &[u8]) {
    let _ = fsck::fsck_image(img);
    let Ok(vol) = Volume::open_region(Region::from_image(img), VolumeConfig::synchronous()) else {
        return;
    };
    vol.abandon();
    let _ = fsck::check_volume(&vol);
    let mut stack = vec![ROOT_INO];
    let mut visited = 0;
    while let Some(d) = stack.pop() {
        let mut entries = Vec::new();
        let _ = vol.readdir(d, 0, |e| {
            entries.push(e);
            entries.len() < 64
        });
        for e in entries {
            visited += 1;
            if visited > 256 {
                return;
            }
            let Ok(a) = vol.getattr(e.ino) else { continue };
            match a.mode & layout::S_IFMT {
                layout::S_IFDIR => stack.push(e.ino),
                layout::S_IFLNK => {
                    let _ = vol.readlink(e.ino);
                }
                _ => {
                    let _ = vol.read_with(e.ino, 0, 1 << 20, |s| s.len());
                    let _ = vol.write(&Cred::ROOT, e.ino, 10, b"xyz");
                    let _ = vol.truncate(&Cred::ROOT, e.ino, a.size / 2);
                }
            }
            for n in vol.listxattr(&Cred::ROOT, e.ino).unwrap_or_default() {
                let _ = vol.getxattr(&Cred::ROOT, e.ino, &n);
            }
            let _ = vol.setxattr(
                &Cred::ROOT,
                e.ino,
                b"user.fuzz",
                &[1; 5000],
                crate::XattrMode::Any,
            );
            let _ = vol.access(&Cred::new(1000, 1000, vec![]), e.ino, 4);
            let _ = vol.rename(
                &Cred::ROOT,
                d,
                &e.name,
                ROOT_INO,
                b"moved",
                crate::RenameFlags::default(),
            );
            let _ = vol.unlink(&Cred::ROOT, ROOT_INO, b"moved");
            let _ = vol.rmdir(&Cred::ROOT, ROOT_INO, b"moved");
        }
    }
    let _ = vol.create(&Cred::ROOT, ROOT_INO, b"new", 0o644, 0);
    let _ = vol.checkpoint_now();
}

/// Apply `(offset, xor)` patches (offsets taken modulo the image size) and exercise.
pub fn exercise_patched(template: &[u8], patches: &[(u32, u8)]) {
    let mut img = template.to_vec();
    for &(off, x) in patches {
        let i = off as usize % img.len();
        img[i] ^= x;
    }
    exercise_image(&img);
}

/// An ACL xattr value from a peer or a user: decode it and, when valid, put it through
/// everything the volume does with ACLs. Nothing may panic, and a valid ACL must come
/// back unchanged from its own encoding.
pub fn exercise_acl(value: &[u8]) {
    use crate::acl::{inherit, Acl};
    let Ok(acl) = Acl::decode(value) else {
        let _ = Acl::decode_header(value);
        return;
    };
    let canonical = acl.encode();
    assert_eq!(
        Acl::decode(&canonical).map(|a| a.encode()).ok().as_ref(),
        Some(&canonical),
        "a valid ACL re-encodes to itself"
    );
    for cred in [
        Cred::new(1000, 1000, vec![]),
        Cred::new(1001, 100, vec![1000, 5]),
    ] {
        for want in [1, 2, 4, 7] {
            let _ = acl.permits(&cred, 1000, want);
        }
    }
    let (mode, _) = acl.equiv_mode();
    assert_eq!(mode & !0o777, 0, "an ACL implies permission bits only");
    let mut c = acl.clone();
    c.chmod(0o751);
    let mut m = acl.clone();
    let (rwx, _) = m.create_masq(0o666);
    assert_eq!(
        rwx & !0o666,
        0,
        "inheritance never adds to the creation mode"
    );
    for is_dir in [false, true] {
        let i = inherit(Some(value), 0o40777, 0o022, is_dir).expect("valid default ACL");
        assert_eq!(i.default.is_some(), is_dir);
    }
}
