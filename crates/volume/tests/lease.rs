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
