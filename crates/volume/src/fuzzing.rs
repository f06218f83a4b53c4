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
