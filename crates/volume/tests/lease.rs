//! Owned leases and page buffers (lease.rs), the volume side of the same-host interface
//! (zcfs-samehost): a lease's extents are the file's bytes in the image and stay intact
//! while the file is overwritten, truncated and checkpointed; its blocks are reused only
//! once it drops; owned pages are placed by a pflush commit or given back.

mod common;
use common::*;
use zcfs_volume::*;

fn vol() -> std::sync::Arc<Volume> {
    memory_volume(8 << 20, VolumeConfig::synchronous())
}

/// The bytes a lease's extents name, read from the image.
fn leased_bytes(img: &[u8], lease: &Lease) -> Vec<u8> {
    let mut out = Vec::new();
    for e in lease.extents() {
        if e.hole {
            out.extend(std::iter::repeat_n(0u8, e.len as usize));
        } else {
            let s = e.image_offset as usize;
            out.extend_from_slice(&img[s..s + e.len as usize]);
        }
    }
    out
}

#[test]
fn a_lease_names_the_files_bytes_and_keeps_them_until_dropped() {
    let v = vol();
    let ino = new_file(&v, ROOT_INO, b"f");
    let data = pattern(0, 5 * BLOCK + 100, 3);
    v.write(&Cred::ROOT, ino, 0, &data).unwrap();
    // A hole in the middle: blocks 2..3.
    v.pfree(&Cred::ROOT, ino, 2 * BLOCK as u64, BLOCK as u64)
        .unwrap();
    let mut want = data.clone();
    want[2 * BLOCK..3 * BLOCK].fill(0);
    let lease = v.lease(ino, 100, 10 * BLOCK).unwrap();
    assert_eq!(lease.extents()[0].file_offset, 100);
    assert!(lease.extents().iter().any(|e| e.hole));
    assert_eq!(
        lease.bytes(),
        want.len() as u64 - 100,
        "stops at end of file"
    );
    assert_eq!(lease.blocks(), 5);
    assert_eq!(leased_bytes(&image_of(&v), &lease), want[100..]);
    let pinned = v.test_door().file_blocks(ino).unwrap();
    // Overwrite, truncate, checkpoint: the leased blocks keep their bytes.
    v.write(&Cred::ROOT, ino, 0, &pattern(0, 6 * BLOCK, 9))
        .unwrap();
    v.truncate(&Cred::ROOT, ino, 0).unwrap();
    v.checkpoint_now().unwrap();
    for b in &pinned {
        assert!(!v.test_door().block_is_free(*b), "leased block {b} freed");
    }
    // New writes must not land on them either.
    v.write(&Cred::ROOT, ino, 0, &pattern(0, 64 * BLOCK, 7))
        .unwrap();
    assert_eq!(leased_bytes(&image_of(&v), &lease), want[100..]);
    drop(lease);
    v.checkpoint_now().unwrap();
    let now = v.test_door().file_blocks(ino).unwrap();
    for b in &pinned {
        assert!(
            v.test_door().block_is_free(*b) || now.contains(b),
            "block {b} neither free nor used once the lease dropped"
        );
    }
    assert_fsck_clean(&v);
}

#[test]
fn a_lease_of_a_directory_or_missing_inode_is_refused() {
    let v = vol();
    assert!(matches!(v.lease(ROOT_INO, 0, BLOCK), Err(FsError::IsDir)));
    assert!(v.lease(999, 0, BLOCK).is_err());
}

#[test]
fn owned_pages_are_placed_by_a_commit_or_given_back() {
    let v = vol();
    let a = new_file(&v, ROOT_INO, b"a");
    let b = new_file(&v, ROOT_INO, b"b");
    let free0 = v.statfs().bfree;
    let dropped = v.reserve_pages_owned(3).unwrap();
    assert_eq!(dropped.image_offsets().len(), 3);
    assert_eq!(v.statfs().bfree, free0 - 3);
    drop(dropped);
    assert_eq!(v.statfs().bfree, free0);

    let pa = v.reserve_pages_owned(2).unwrap();
    let pb = v.reserve_pages_owned(1).unwrap();
    // Fill through "another mapping": here the test door's image is a copy, so fill
    // through the PageBuf view the owned pages turn into.
    let mut ba = pa.into_page_buf(&v).unwrap();
    ba.page_mut(0).fill(1);
    ba.page_mut(1).fill(2);
    let mut bb = pb.into_page_buf(&v).unwrap();
    bb.page_mut(0).fill(3);
    let mut t = PflushTxn::default();
    t.pflush_add(a, 0, ba, None).unwrap();
    t.pflush_add(b, 0, bb, Some(10)).unwrap();
    v.pflush_commit(t).unwrap();
    let mut buf = vec![0; 2 * BLOCK];
    assert_eq!(v.read(a, 0, &mut buf).unwrap(), 2 * BLOCK);
    assert!(buf[..BLOCK].iter().all(|&x| x == 1) && buf[BLOCK..].iter().all(|&x| x == 2));
    assert_eq!(v.read(b, 0, &mut buf).unwrap(), 10);
    assert!(buf[..10].iter().all(|&x| x == 3));
    assert_fsck_clean(&v);
}

#[test]
fn owned_pages_of_another_volume_are_refused() {
    let v = vol();
    let w = vol();
    let p = v.reserve_pages_owned(1).unwrap();
    assert!(matches!(p.into_page_buf(&w), Err(FsError::Invalid(_))));
    // Given back to their own volume on the way.
    assert_fsck_clean(&v);
}

/// The file's bytes as `read` gives them (up to `max`).
fn file_bytes(v: &Volume, ino: u64, max: usize) -> Vec<u8> {
    let mut buf = vec![0u8; max];
    let n = v.read(ino, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// What a same-host reader relies on to keep a lease and skip asking again
/// (changes.rs): while the change counter of a file's slot stays as it was when the
/// lease was taken, the leased extents are the file's bytes. Random changes of every
/// kind (write, truncate, setattr size, hole punch, fallocate, pflush commit, a
/// hard link and its removal), each followed by a check of every lease kept so far;
/// and every change of the file's bytes is seen as a changed counter.
#[test]
fn an_unchanged_counter_means_the_leased_extents_are_the_file() {
    use rand::{Rng, SeedableRng};
    let v = vol();
    let counters = v.change_counters().unwrap();
    let ino = new_file(&v, ROOT_INO, b"f");
    let other = new_file(&v, ROOT_INO, b"g");
    let max = 24 * BLOCK;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_c0de);
    // (lease, counter when taken, bytes then)
    let mut kept: Vec<(Lease, u64, Vec<u8>)> = Vec::new();
    let mut raised = 0;
    for step in 0..400 {
        let before = file_bytes(&v, ino, max);
        let count = counters.count(ino);
        let off = rng.gen_range(0..16 * BLOCK) as u64;
        let len = rng.gen_range(1..4 * BLOCK);
        let what = rng.gen_range(0..9);
        match what {
            0 | 1 => {
                let data = pattern(off, len, step as u8);
                v.write(&Cred::ROOT, ino, off, &data).unwrap();
            }
            2 => v.truncate(&Cred::ROOT, ino, off).unwrap(),
            3 => {
                let set = SetAttr {
                    size: Some(off + len as u64),
                    ..Default::default()
                };
                v.setattr(&Cred::ROOT, ino, &set, SizeRight::WritableHandle)
                    .unwrap();
            }
            4 => v.pfree(&Cred::ROOT, ino, off, len as u64).unwrap(),
            5 => v
                .fallocate(
                    &Cred::ROOT,
                    ino,
                    off,
                    len as u64,
                    FallocMode::ZeroRange { keep_size: true },
                )
                .unwrap(),
            6 => {
                let mut pages = v.reserve_pages(1).unwrap();
                pages.page_mut(0).fill(step as u8 | 1);
                let mut t = PflushTxn::default();
                t.pflush_add(ino, off / BLOCK as u64 * BLOCK as u64, pages, None)
                    .unwrap();
                v.pflush_commit(t).unwrap();
            }
            7 => {
                // Another file's change: this file's counter may move (shared slot) or
                // not; leases of this file stay valid either way.
                v.write(&Cred::ROOT, other, off, &pattern(off, len, 1))
                    .unwrap();
            }
            _ => {
                let lease = v.lease(ino, 0, max).unwrap();
                let now = counters.count(ino);
                let bytes = file_bytes(&v, ino, max);
                assert_eq!(leased_bytes(&image_of(&v), &lease), bytes, "step {step}");
                kept.push((lease, now, bytes));
                if kept.len() > 8 {
                    drop(kept.remove(0));
                }
            }
        }
        let after = file_bytes(&v, ino, max);
        if after != before {
            assert_ne!(
                counters.count(ino),
                count,
                "step {step}: op {what} changed the file unseen"
            );
            raised += 1;
        }
        let img = image_of(&v);
        for (lease, at, bytes) in &kept {
            assert_eq!(
                &leased_bytes(&img, lease),
                bytes,
                "step {step}: a leased block changed"
            );
            if counters.count(ino) == *at {
                assert_eq!(
                    bytes, &after,
                    "step {step}: counter unchanged, file changed"
                );
            }
        }
    }
    assert!(raised > 100, "the changes were seen ({raised})");
    // A link and its removal change the inode (nlink, ctime) too.
    let c = counters.count(ino);
    v.link(&Cred::ROOT, ino, ROOT_INO, b"h").unwrap();
    assert_ne!(counters.count(ino), c);
    let c = counters.count(ino);
    v.unlink(&Cred::ROOT, ROOT_INO, b"h").unwrap();
    assert_ne!(counters.count(ino), c);
    // Reads and leases change nothing.
    let c = counters.count(ino);
    let _ = file_bytes(&v, ino, max);
    drop(v.lease(ino, 0, max).unwrap());
    v.getattr(ino).unwrap();
    assert_eq!(counters.count(ino), c);
    drop(kept);
    assert_fsck_clean(&v);
}
