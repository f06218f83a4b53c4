//! Scenario tests of the volume's semantics, with remounts in between.

mod common;
use common::*;
use zcfs_volume::mode::*;
use zcfs_volume::*;

#[test]
fn files_dirs_links_and_remount() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let d = vol.mkdir(&Cred::ROOT, ROOT_INO, b"dir", 0o750).unwrap();
    assert_eq!((d.uid, d.gid, d.nlink), (0, 0, 2));
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 3);
    let f = vol.create(&Cred::ROOT, d.ino, b"file", 0o640, 0).unwrap();
    assert_eq!(
        vol.write(&Cred::ROOT, f.ino, 0, b"hello world").unwrap(),
        11
    );
    assert_eq!(vol.write(&Cred::ROOT, f.ino, 6, b"WORLD").unwrap(), 5);
    let l = vol.link(&Cred::ROOT, f.ino, ROOT_INO, b"hard").unwrap();
    assert_eq!(l.nlink, 2);
    vol.symlink(&Cred::ROOT, ROOT_INO, b"sym", b"dir/file")
        .unwrap();
    assert!(matches!(
        vol.create(&Cred::ROOT, d.ino, b"file", 0o644, 0),
        Err(FsError::Exists)
    ));
    assert!(matches!(
        vol.rmdir(&Cred::ROOT, ROOT_INO, b"dir"),
        Err(FsError::NotEmpty)
    ));
    assert!(matches!(
        vol.unlink(&Cred::ROOT, ROOT_INO, b"dir"),
        Err(FsError::IsDir)
    ));
    assert!(matches!(
        vol.link(&Cred::ROOT, d.ino, ROOT_INO, b"x"),
        Err(FsError::NotPermitted(_))
    ));
    assert!(matches!(
        vol.lookup(&Cred::ROOT, ROOT_INO, &[b'a'; 256]),
        Err(FsError::NameTooLong)
    ));

    let vol = remount_with(vol, VolumeConfig::synchronous());
    let f2 = vol.lookup(&Cred::ROOT, ROOT_INO, b"hard").unwrap();
    assert_eq!(f2.ino, f.ino);
    assert_eq!(f2.nlink, 2);
    let mut buf = [0u8; 32];
    let n = vol.read(f.ino, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello WORLD");
    let s = vol.lookup(&Cred::ROOT, ROOT_INO, b"sym").unwrap();
    assert_eq!(vol.readlink(s.ino).unwrap(), b"dir/file");
    assert_eq!(s.mode & S_IFMT, S_IFLNK);
    vol.unlink(&Cred::ROOT, d.ino, b"file").unwrap();
    assert_eq!(vol.getattr(f.ino).unwrap().nlink, 1);
    vol.unlink(&Cred::ROOT, ROOT_INO, b"hard").unwrap();
    assert!(matches!(vol.getattr(f.ino), Err(FsError::Stale)));
    vol.rmdir(&Cred::ROOT, ROOT_INO, b"dir").unwrap();
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 2);
    assert_fsck_clean(&vol);
}

#[test]
fn sparse_large_and_truncate() {
    let vol = memory_volume(64 << 20, VolumeConfig::default());
    let f = vol
        .create(&Cred::ROOT, ROOT_INO, b"sparse", 0o644, 0)
        .unwrap();
    // A write far out needs a 3-level map; everything before it is a hole.
    let far = 5u64 << 30;
    vol.write(&Cred::ROOT, f.ino, far, b"tail").unwrap();
    assert_eq!(vol.getattr(f.ino).unwrap().size, far + 4);
    let mut buf = vec![1u8; 8192];
    assert_eq!(vol.read(f.ino, far - 8188, &mut buf).unwrap(), 8192);
    assert!(buf[..8188].iter().all(|&b| b == 0));
    assert_eq!(&buf[8188..], b"tail");
    // 3 MiB of data across many blocks, unaligned.
    let data: Vec<u8> = (0..3_000_001u32).map(|i| (i % 251) as u8).collect();
    vol.write(&Cred::ROOT, f.ino, 777, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    vol.read(f.ino, 777, &mut back).unwrap();
    assert!(back == data);
    // Truncate down into the middle of a block: bytes past the end must come back as
    // zeros when the file grows again.
    vol.truncate(&Cred::ROOT, f.ino, 5000).unwrap();
    vol.truncate(&Cred::ROOT, f.ino, 10000).unwrap();
    let mut b2 = vec![9u8; 10000];
    vol.read(f.ino, 0, &mut b2).unwrap();
    assert_eq!(&b2[777..5000], &data[..5000 - 777]);
    assert!(b2[5000..].iter().all(|&b| b == 0));
    let blocks_before = vol.statfs().bfree;
    vol.truncate(&Cred::ROOT, f.ino, 0).unwrap();
    vol.sync().unwrap();
    let vol = remount_with(vol, VolumeConfig::default());
    assert!(vol.statfs().bfree > blocks_before);
    assert_eq!(vol.getattr(f.ino).unwrap().blocks, 0);
    assert_fsck_clean(&vol);
}

#[test]
fn rename_variants() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let a = vol.mkdir(&Cred::ROOT, ROOT_INO, b"a", 0o755).unwrap();
    let b = vol.mkdir(&Cred::ROOT, ROOT_INO, b"b", 0o755).unwrap();
    let x = vol.create(&Cred::ROOT, a.ino, b"x", 0o644, 0).unwrap();
    let y = vol.create(&Cred::ROOT, b.ino, b"y", 0o644, 0).unwrap();
    let none = RenameFlags::default();
    let noreplace = RenameFlags::from_bits(1).unwrap();
    let exchange = RenameFlags::from_bits(2).unwrap();
    assert!(matches!(
        vol.rename(&Cred::ROOT, a.ino, b"x", b.ino, b"y", noreplace),
        Err(FsError::Exists)
    ));
    vol.rename(&Cred::ROOT, a.ino, b"x", b.ino, b"y", exchange)
        .unwrap();
    assert_eq!(vol.lookup(&Cred::ROOT, a.ino, b"x").unwrap().ino, y.ino);
    assert_eq!(vol.lookup(&Cred::ROOT, b.ino, b"y").unwrap().ino, x.ino);
    // Over an existing file: the target's inode goes away.
    vol.rename(&Cred::ROOT, a.ino, b"x", b.ino, b"y", none)
        .unwrap();
    assert!(matches!(vol.getattr(x.ino), Err(FsError::Stale)));
    assert!(matches!(
        vol.lookup(&Cred::ROOT, a.ino, b"x"),
        Err(FsError::NotFound)
    ));
    // Directory across directories: parent link counts move.
    vol.rename(&Cred::ROOT, ROOT_INO, b"a", b.ino, b"a2", none)
        .unwrap();
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(vol.getattr(b.ino).unwrap().nlink, 3);
    assert_eq!(vol.parent_of(&Cred::ROOT, a.ino).unwrap(), b.ino);
    // Below itself is refused.
    assert!(matches!(
        vol.rename(&Cred::ROOT, ROOT_INO, b"b", a.ino, b"loop", none),
        Err(FsError::Invalid(_))
    ));
    assert!(RenameFlags::from_bits(4).is_err());
    let vol = remount_with(vol, VolumeConfig::synchronous());
    assert_fsck_clean(&vol);
}

#[test]
fn xattrs_setattr_statfs_and_setgid() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let d = vol
        .mkdir(&Cred::new(0, 50, vec![]), ROOT_INO, b"shared", 0o2775)
        .unwrap();
    assert_ne!(d.mode & S_ISGID, 0);
    let f = vol.create(&Cred::ROOT, d.ino, b"f", 0o644, 0).unwrap();
    assert_eq!(f.gid, 50, "setgid directory gives its group");
    let sub = vol.mkdir(&Cred::ROOT, d.ino, b"sub", 0o755).unwrap();
    assert_ne!(sub.mode & S_ISGID, 0, "subdirectories inherit setgid");
    vol.setxattr(&Cred::ROOT, f.ino, b"user.k", b"v1", XattrMode::Any)
        .unwrap();
    assert!(matches!(
        vol.setxattr(&Cred::ROOT, f.ino, b"user.k", b"v", XattrMode::Create),
        Err(FsError::Exists)
    ));
    assert!(matches!(
        vol.setxattr(&Cred::ROOT, f.ino, b"user.n", b"v", XattrMode::Replace),
        Err(FsError::NoXattr)
    ));
    vol.setxattr(&Cred::ROOT, f.ino, b"user.k", b"v2", XattrMode::Replace)
        .unwrap();
    assert!(matches!(
        vol.setxattr(&Cred::ROOT, f.ino, b"user.big", &[0; 65537], XattrMode::Any),
        Err(FsError::XattrValueTooBig(65537))
    ));
    let t = Time {
        sec: 1_000_000_000,
        nsec: 123_456_789,
    };
    let a = vol
        .setattr(
            &Cred::ROOT,
            f.ino,
            &SetAttr {
                mode: Some(0o600),
                uid: Some(7),
                mtime: Some(SetTime::At(t)),
                ..Default::default()
            },
            SizeRight::Permission,
        )
        .unwrap();
    assert_eq!((a.mode & 0o7777, a.uid, a.mtime), (0o600, 7, t));
    let s = vol.statfs();
    assert!(s.bfree < s.blocks && s.ffree < s.files && s.namelen == 255);
    let vol = remount_with(vol, VolumeConfig::synchronous());
    assert_eq!(vol.getxattr(&Cred::ROOT, f.ino, b"user.k").unwrap(), b"v2");
    assert_eq!(vol.getattr(f.ino).unwrap().mtime, t);
    vol.removexattr(&Cred::ROOT, f.ino, b"user.k").unwrap();
    assert!(vol.listxattr(&Cred::ROOT, f.ino).unwrap().is_empty());
    assert_fsck_clean(&vol);
}

#[test]
fn many_entries_readdir_cookies_and_log_wrap() {
    let mkfs = mkfs_with(4096, 256 << 10);
    let vol = memory_volume_with(64 << 20, &mkfs, VolumeConfig::default());
    let d = vol.mkdir(&Cred::ROOT, ROOT_INO, b"big", 0o755).unwrap();
    let n: usize = 3000;
    for i in 0..n {
        vol.create(
            &Cred::ROOT,
            d.ino,
            format!("entry-with-a-longish-name-{i:06}").as_bytes(),
            0o644,
            0,
        )
        .unwrap();
    }
    for i in (0..n).step_by(3) {
        vol.unlink(
            &Cred::ROOT,
            d.ino,
            format!("entry-with-a-longish-name-{i:06}").as_bytes(),
        )
        .unwrap();
    }
    // Read the directory in pages, resuming from cookies.
    let mut seen = Vec::new();
    let mut cookie = 0;
    loop {
        let mut page = Vec::new();
        vol.readdir(d.ino, cookie, |e| {
            page.push(e);
            page.len() < 100
        })
        .unwrap();
        if page.is_empty() {
            break;
        }
        cookie = page.last().unwrap().next;
        seen.extend(page.into_iter().map(|e| e.name));
    }
    assert_eq!(seen.len(), n - n.div_ceil(3));
    let info = vol.info();
    assert!(
        info.stats.checkpoints > 0,
        "the log must have been checkpointed: {info:?}"
    );
    let vol = remount_with(vol, VolumeConfig::default());
    assert_eq!(vol.dir_len(d.ino).unwrap(), n - n.div_ceil(3));
    assert_fsck_clean(&vol);
}

#[test]
fn zero_copy_read_reservation_and_flac_calls() {
    let path = std::env::temp_dir().join(format!("zcfs-zc-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    Volume::mkfs(
        &path,
        16 << 20,
        &MkfsOptions {
            inodes: None,
            log_bytes: None,
            ..Default::default()
        },
    )
    .unwrap();
    let vol = Volume::open(&path, VolumeConfig::default()).unwrap();
    let f = vol.create(&Cred::ROOT, ROOT_INO, b"f", 0o644, 0).unwrap();
    // Reserve, fill in place, commit: no user-space copy.
    let copies_before = vol.stats.snapshot().user_copy_bytes;
    let mut r = vol.reserve_write(&Cred::ROOT, f.ino, 100, 10000).unwrap();
    let mut k = 0u8;
    for s in r.slices_mut() {
        for b in s.iter_mut() {
            *b = k;
            k = k.wrapping_add(1);
        }
    }
    r.commit().unwrap();
    assert_eq!(vol.stats.snapshot().user_copy_bytes, copies_before);
    // Borrowed slices cover exactly the range.
    let total = vol
        .read_with(f.ino, 0, 20000, |s| {
            let all: Vec<u8> = s.concat();
            assert!(all[..100].iter().all(|&b| b == 0));
            assert_eq!(all[100], 0);
            assert_eq!(all[355], 255);
            all.len()
        })
        .unwrap();
    assert_eq!(total, 10100);
    // pflush: two files' pages committed in one entry.
    let g = vol.create(&Cred::ROOT, ROOT_INO, b"g", 0o644, 0).unwrap();
    let mut p1 = vol.reserve_pages(2).unwrap();
    p1.page_mut(0).fill(0xaa);
    p1.page_mut(1).fill(0xbb);
    let mut p2 = vol.reserve_pages(1).unwrap();
    p2.page_mut(0).fill(0xcc);
    let mut t = PflushTxn::default();
    t.pflush_add(f.ino, 3 * 4096, p1, None).unwrap();
    t.pflush_add(g.ino, 0, p2, Some(100)).unwrap();
    vol.pflush_commit(t).unwrap();
    assert_eq!(vol.getattr(f.ino).unwrap().size, 5 * 4096);
    assert_eq!(vol.getattr(g.ino).unwrap().size, 100);
    // zcopy_to: pages attached copy-on-write; writing to them leaves the file alone.
    {
        let mut pages = vol.zcopy_to(f.ino, 3 * 4096, 2 * 4096).unwrap();
        assert!(pages.as_slice()[..4096].iter().all(|&b| b == 0xaa));
        assert!(pages.as_slice()[4096..].iter().all(|&b| b == 0xbb));
        pages.as_mut_slice()[0] = 1;
        // Overwrite the file block while attached: the attached view keeps its data.
        vol.write(&Cred::ROOT, f.ino, 4 * 4096, &[0x11; 4096])
            .unwrap();
        vol.sync().unwrap();
        assert!(pages.as_slice()[4096..].iter().all(|&b| b == 0xbb));
    }
    let mut one = [0u8; 1];
    vol.read(f.ino, 3 * 4096, &mut one).unwrap();
    assert_eq!(one[0], 0xaa);
    // pfree: a hole in the middle.
    vol.pfree(&Cred::ROOT, f.ino, 3 * 4096, 4096).unwrap();
    vol.read(f.ino, 3 * 4096 + 5, &mut one).unwrap();
    assert_eq!(one[0], 0);
    assert_fsck_clean(&vol);
    drop(vol);
    let report = zcfs_volume::fsck::fsck_path(&path, false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn no_space_is_an_error_not_a_panic() {
    let vol = memory_volume(1 << 20, VolumeConfig::default());
    let f = vol.create(&Cred::ROOT, ROOT_INO, b"f", 0o644, 0).unwrap();
    let big = vec![7u8; 2 << 20];
    // A write larger than the free space writes what fits (a short write, as POSIX
    // allows), and the next one is told there is no room.
    let n = vol.write(&Cred::ROOT, f.ino, 0, &big).unwrap();
    assert!(n > 0 && n < big.len(), "{n}");
    assert!(matches!(
        vol.write(&Cred::ROOT, f.ino, n as u64, &big[n..]),
        Err(FsError::NoSpace)
    ));
    // Space comes back once the file is cut, and small writes still work.
    vol.truncate(&Cred::ROOT, f.ino, 0).unwrap();
    vol.write(&Cred::ROOT, f.ino, 0, &[1u8; 8192]).unwrap();
    let mut names = 0;
    loop {
        match vol.create(
            &Cred::ROOT,
            ROOT_INO,
            format!("n{names}").as_bytes(),
            0o644,
            0,
        ) {
            Ok(_) => names += 1,
            Err(FsError::NoInodes) | Err(FsError::NoSpace) => break,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!(names > 10);
    let vol = remount_with(vol, VolumeConfig::default());
    assert_fsck_clean(&vol);
}

#[test]
fn bad_images_give_errors() {
    let vol = memory_volume(1 << 20, VolumeConfig::synchronous());
    vol.create(&Cred::ROOT, ROOT_INO, b"f", 0o644, 0).unwrap();
    // Empty the log, or replay would repair the damage done below.
    vol.checkpoint_now().unwrap();
    let img = image_of(&vol);
    vol.abandon();
    let open =
        |b: &[u8]| Volume::open_region(Region::from_image(b), VolumeConfig::default()).map(|_| ());
    assert!(open(&img).is_ok());
    assert!(matches!(open(&vec![0u8; img.len()]), Err(FsError::NotZcfs)));
    assert!(open(&img[..4096]).is_err());
    let mut both = img.clone();
    both[60] ^= 0xff;
    both[4096 + 60] ^= 0xff;
    assert!(matches!(open(&both), Err(FsError::Corrupt(_))));
    // One bad superblock copy: the other is used.
    let mut one = img.clone();
    one[60] ^= 0xff;
    assert!(open(&one).is_ok());
    // Shrunk image: geometry larger than the file.
    assert!(open(&img[..img.len() / 2]).is_err());
    // Corrupt the root inode record.
    let geo = Geometry::plan(img.len() as u64, Some(64), Some(32 << 10)).unwrap();
    let mut bad_root = img.clone();
    bad_root[(geo.itable_start as usize) * 4096 + 12] ^= 0x40;
    assert!(matches!(open(&bad_root), Err(FsError::Corrupt(_))));
}

#[test]
fn unlinked_open_file_lives_until_release_and_crash_reaps_it() {
    let vol = memory_volume(4 << 20, VolumeConfig::synchronous());
    let f = vol.create(&Cred::ROOT, ROOT_INO, b"f", 0o644, 0).unwrap();
    vol.write(&Cred::ROOT, f.ino, 0, b"still here").unwrap();
    vol.open_handle(f.ino).unwrap();
    vol.unlink(&Cred::ROOT, ROOT_INO, b"f").unwrap();
    assert!(matches!(
        vol.lookup(&Cred::ROOT, ROOT_INO, b"f"),
        Err(FsError::NotFound)
    ));
    let mut buf = [0u8; 10];
    assert_eq!(vol.read(f.ino, 0, &mut buf).unwrap(), 10);
    assert_eq!(&buf, b"still here");
    assert_eq!(vol.getattr(f.ino).unwrap().nlink, 0);
    let free_before = vol.statfs().ffree;
    // Crash now: the next mount frees the orphan.
    vol.sync().unwrap();
    let img = image_of(&vol);
    let crashed =
        Volume::open_region(Region::from_image(&img), VolumeConfig::synchronous()).unwrap();
    assert!(matches!(crashed.getattr(f.ino), Err(FsError::Stale)));
    assert_eq!(crashed.statfs().ffree, free_before + 1);
    assert_fsck_clean(&crashed);
    // Without a crash: the last release frees it.
    vol.release_handle(f.ino).unwrap();
    assert!(matches!(vol.getattr(f.ino), Err(FsError::Stale)));
    assert_eq!(vol.statfs().ffree, free_before + 1);
    assert_fsck_clean(&vol);
}
