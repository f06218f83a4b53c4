//! Landing reservations for layer-2 writes (issue 12; data.rs `reserve_write_landing`):
//! the constants agree with the transport's, frames landed by the transport's own
//! segmentation touch nothing but the reservation, random reservations, commits and
//! aborts keep the free-space accounting exact, every budget check fails cleanly, and
//! a volume too full or too fragmented refuses with ENOSPC and changes nothing. The
//! crash enumeration is in crash.rs (`seq1_landing_writes_...`).

mod common;
use common::*;
use proptest::prelude::*;
use std::sync::Arc;
use zcfs_volume::*;

#[test]
fn the_landing_constants_are_the_transports() {
    assert_eq!(LANDING_FRONT, zcfs_l2::MIN_FRONT);
    assert_eq!(LANDING_CLOBBER, zcfs_l2::HEADER_LEN as u64);
    assert_eq!(LANDING_EXTENT_MAX_BLOCKS, zcfs_l2::MAX_EXTENT_BLOCKS);
    assert_eq!(LANDING_TAIL, zcfs_l2::layout::MIN_TAIL);
    const { assert!(LANDING_GUARD_BYTES >= zcfs_l2::layout::MIN_TAIL) };
    assert_eq!(BLOCK, zcfs_l2::BLOCK_SIZE);
}

/// A volume whose free space is holes of every size between live blocks of other
/// files: fresh blocks have live data right in front of them.
fn packed_volume() -> (Arc<Volume>, u64) {
    let vol = memory_volume_with(
        4 << 20,
        &mkfs_with(256, 64 << 10),
        VolumeConfig::synchronous(),
    );
    let mut files = Vec::new();
    for i in 0..60u64 {
        let f = new_file(&vol, ROOT_INO, format!("o{i}").as_bytes());
        let blocks = 1 + (i * 7) % 5;
        vol.write(
            &Cred::ROOT,
            f,
            0,
            &pattern(i, blocks as usize * BLOCK, i as u8),
        )
        .unwrap();
        files.push(f);
    }
    for i in (0..60).step_by(3) {
        vol.unlink(&Cred::ROOT, ROOT_INO, format!("o{i}").as_bytes())
            .unwrap();
    }
    vol.checkpoint_now().unwrap();
    let f = new_file(&vol, ROOT_INO, b"target");
    vol.write(&Cred::ROOT, f, 0, &pattern(0, 10_000, 99))
        .unwrap();
    vol.checkpoint_now().unwrap();
    (vol, f)
}

/// Receive `data` for file bytes `[off, ...)` into a landing reservation exactly as the
/// kernel lands the transport's frames: per extent, segments last first, each frame
/// (a junk 46-byte header and its payload) written at fill address + XDP headroom.
/// Returns the lowest and highest byte written per extent (image offsets).
fn land_frames(r: &mut WriteReservation<'_>, off: u64, data: &[u8]) -> Vec<(u64, u64)> {
    let exts = r.landing_extents().to_vec();
    let end = off + data.len() as u64;
    let mut touched = Vec::new();
    for (e, s) in exts.iter().zip(r.landing_mut()) {
        let base = e.offset - LANDING_GAP_BYTES; // image offset of s[0]
        let ext = zcfs_l2::Extent {
            offset: e.offset,
            blocks: e.blocks,
        };
        // The transport accepts the extent in an image of this size.
        ext.check_receivable(usize::MAX).unwrap();
        let plan = zcfs_l2::layout::fill_plan(&ext);
        let segs = zcfs_l2::layout::segments(e.blocks);
        let (mut lo, mut hi) = (u64::MAX, 0);
        for (p, seg) in plan.iter().zip(&segs) {
            // The fill address (headroom, never written) is the reservation's too.
            assert!(p.fill >= base, "fill address {} before the gap", p.fill);
            let at = p.fill + 256;
            let mut frame = vec![0x5Au8; zcfs_l2::HEADER_LEN];
            for i in 0..seg.len as u64 {
                let fo = e.file_offset + seg.start as u64 + i;
                frame.push(if (off..end).contains(&fo) {
                    data[(fo - off) as usize]
                } else {
                    LANDING_JUNK
                });
            }
            assert_eq!(frame.len() as u32, p.len);
            let i = (at - base) as usize;
            s[i..i + frame.len()].copy_from_slice(&frame);
            lo = lo.min(at);
            hi = hi.max(at + frame.len() as u64);
        }
        // Only the header of the lowest segment survives, in the clobbered bytes.
        assert_eq!((lo, hi), (e.offset - LANDING_CLOBBER, e.offset + e.bytes()));
        touched.push((lo, hi));
    }
    touched
}

/// Every byte of `after` that differs from `before` lies in one of `owned` (block
/// ranges); returns how many differ.
fn changed_only_in(before: &[u8], after: &[u8], owned: &[(u64, u64)]) -> usize {
    let mut n = 0;
    for (i, (a, b)) in before.iter().zip(after).enumerate() {
        if a != b {
            let blk = i as u64 / BLOCK as u64;
            assert!(
                owned.iter().any(|&(s, e)| (s..e).contains(&blk)),
                "byte {i} (block {blk}) changed outside the reservation"
            );
            n += 1;
        }
    }
    n
}

#[test]
fn frames_landed_in_a_reservation_change_no_other_byte() {
    let (vol, f) = packed_volume();
    let others: Vec<String> = dump_volume(&vol)
        .unwrap()
        .into_iter()
        .filter(|l| !l.starts_with("/target/") && l != "/ ")
        .collect();
    let geo = vol.geometry();
    // Unaligned at both ends, over the end of the file: 77 file blocks.
    let (off, len) = (5000u64, 75 * BLOCK + 123);
    let data = pattern(off, len, 7);
    let before = image_of(&vol);
    let mut r = vol.reserve_write_landing(&Cred::ROOT, f, off, len).unwrap();
    let exts = r.landing_extents().to_vec();
    assert!(exts.len() >= 3, "{exts:?}");
    let mut owned = Vec::new();
    let mut next_front_was_live = 0;
    for e in &exts {
        let b = e.offset / BLOCK as u64;
        owned.push((b - LANDING_GAP_BLOCKS, b + e.blocks as u64));
        assert!(
            b - LANDING_GAP_BLOCKS >= geo.data_start,
            "gap in the metadata"
        );
        // At the bound: the whole front is in the gap, the byte before the gap is
        // not the reservation's.
        assert_eq!((e.offset - LANDING_FRONT) / BLOCK as u64, b - 1);
        assert_eq!((e.offset - LANDING_GAP_BYTES) / BLOCK as u64, b - 1);
        let before_gap = b - LANDING_GAP_BLOCKS - 1;
        if !vol.test_door().block_is_free(before_gap) {
            next_front_was_live += 1;
        }
    }
    // Land the frames; nothing else but the reservation's blocks changed (no fsync,
    // no commit yet: the image is the mapping).
    let touched = land_frames(&mut r, off, &data);
    assert_eq!(touched.len(), exts.len());
    let mid = image_of_during(&vol);
    let n = changed_only_in(&before, &mid, &owned);
    assert!(n > len, "the frames landed {n} bytes");
    // The clobbered bytes are the junk header's.
    for e in &exts {
        let front = (e.offset - LANDING_CLOBBER) as usize;
        assert!(mid[front..e.offset as usize].iter().all(|&x| x == 0x5A));
    }
    assert_eq!(r.commit().unwrap(), len);
    // Every other file is as it was; the target has the new bytes; fsck is clean.
    let after: Vec<String> = dump_volume(&vol)
        .unwrap()
        .into_iter()
        .filter(|l| !l.starts_with("/target/") && l != "/ ")
        .collect();
    assert_eq!(after, others);
    let mut got = vec![0u8; len];
    assert_eq!(vol.read(f, off, &mut got).unwrap(), len);
    assert_eq!(got, data);
    let mut head = vec![0u8; off as usize];
    vol.read(f, 0, &mut head).unwrap();
    assert_eq!(head, pattern(0, 10_000, 99)[..off as usize]);
    assert_fsck_clean(&vol);
    let mapped = vol.test_door().file_blocks(f).unwrap();
    for &(g, _) in &owned {
        assert!(vol.test_door().block_is_free(g), "gap {g} not freed");
        assert!(!mapped.contains(&g));
    }
    println!(
        "{} extents, {n} bytes landed, {next_front_was_live} gaps with a used block in front",
        exts.len()
    );
    assert!(
        next_front_was_live > 0,
        "the test never put a gap right behind a used block"
    );
}

/// The image while a reservation is open (the test alone uses the volume).
fn image_of_during(vol: &Volume) -> Vec<u8> {
    // SAFETY: the reservation's views are dropped and nothing else runs.
    unsafe { vol.test_door().image() }
}

// ---- random reservations, commits and aborts against the model ----

fn path() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["x", "y", "z", "a", "a/x", "a/y"]).prop_map(String::from)
}

fn op() -> impl Strategy<Value = Step> {
    let w = || (path(), 0u64..200_000, 1usize..200_000, any::<u8>());
    prop_oneof![
        3 => path().prop_map(Step::Create),
        1 => path().prop_map(Step::Mkdir),
        3 => w().prop_map(|(p, o, l, s)| Step::Write(p, o, l, s)),
        5 => w().prop_map(|(p, o, l, s)| Step::LandingWrite(p, o, l, s)),
        3 => w().prop_map(|(p, o, l, s)| Step::LandingAbort(p, o, l, s)),
        2 => (path(), 0u64..200_000).prop_map(|(p, s)| Step::Truncate(p, s)),
        2 => path().prop_map(Step::Unlink),
        1 => (path(), 0u64..100_000, 1u64..100_000).prop_map(|(p, o, l)| Step::PunchHole(p, o, l)),
        1 => (path(), 0u64..100_000, 1u64..100_000, prop::sample::select(vec![0, 1]))
            .prop_map(|(p, o, l, m)| Step::Fallocate(p, o, l, m)),
        1 => path().prop_map(Step::Fsync),
    ]
}

/// The same step with ordinary writes (landing writes as writes, aborts as nothing).
fn ordinary(op: &Step) -> Option<Step> {
    match op {
        Step::LandingWrite(p, o, l, s) => Some(Step::Write(p.clone(), *o, *l, *s)),
        Step::LandingAbort(..) => None,
        other => Some(other.clone()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Random landing reservations (committed and aborted) among other operations:
    /// the volume equals the model after every step, fsck is clean (the allocator
    /// counts exactly the blocks the inodes own: no gap leaked or kept), and a twin
    /// volume that does the same with ordinary writes has exactly as many blocks in
    /// use (and, without batching, as many free); `land` checks that every gap is free
    /// and in no file right after its commit. At the end a remount gives the same tree.
    #[test]
    fn landing_reservations_match_the_model_and_leak_nothing(
        ops in prop::collection::vec(op(), 1..40),
        batched in any::<bool>(),
    ) {
        let cfg = if batched { VolumeConfig::default() } else { VolumeConfig::synchronous() };
        let vol = memory_volume(16 << 20, cfg.clone());
        let twin = memory_volume(16 << 20, cfg.clone());
        let mut model = Model::new();
        for (i, op) in ops.iter().enumerate() {
            let want = model.apply(op);
            let got = apply_volume(&vol, op);
            prop_assert_eq!(got, want, "op {} {:?}", i, op);
            if let Some(o) = ordinary(op) {
                apply_volume(&twin, &o).ok();
            }
            // Blocks in use (fsck: what the inodes own, which must equal what the
            // allocator counts) do not depend on where blocks are.
            let (a, b) = (zcfs_volume::fsck::check_volume(&vol), zcfs_volume::fsck::check_volume(&twin));
            prop_assert!(a.is_clean(), "after op {} {:?}: {:?}", i, op, a.problems);
            prop_assert_eq!(a.blocks_used, b.blocks_used, "blocks in use after op {} {:?}", i, op);
            if !batched {
                // statfs counts blocks freed by the pending batch as used; a batch ends
                // when its log entries fill the ring, and their size depends on where
                // blocks are (adjacent records merge), so only without batching is
                // statfs comparable between the two volumes.
                prop_assert_eq!(vol.statfs().bfree, twin.statfs().bfree, "free blocks after op {} {:?}", i, op);
            }
        }
        prop_assert_eq!(dump_volume(&vol).unwrap(), model.dump());
        let report = zcfs_volume::fsck::check_volume(&vol);
        prop_assert!(report.is_clean(), "{:?}", report.problems);
        let used = report.blocks_used;
        let twin_used = zcfs_volume::fsck::check_volume(&twin).blocks_used;
        prop_assert_eq!(used, twin_used);
        vol.sync().unwrap();
        let img = image_of(&vol);
        vol.abandon();
        twin.abandon();
        let again = Volume::open_region(Region::from_image(&img), cfg).unwrap();
        prop_assert_eq!(dump_volume(&again).unwrap(), model.dump());
        let report = zcfs_volume::fsck::check_volume(&again);
        prop_assert!(report.is_clean(), "{:?}", report.problems);
        prop_assert_eq!(report.blocks_used, used);
        again.abandon();
    }
}

// ---- failures ----

#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    tree: Vec<String>,
    bfree: u64,
    ffree: u64,
    blocks_used: u64,
}

fn snapshot(vol: &Volume) -> Snapshot {
    let s = vol.statfs();
    Snapshot {
        tree: dump_volume(vol).unwrap(),
        bfree: s.bfree,
        ffree: s.ffree,
        blocks_used: zcfs_volume::fsck::check_volume(vol).blocks_used,
    }
}

/// Landing writes of every shape: new blocks, overwrites, map levels, several
/// extents and log pieces, a preallocated file's reserve.
fn landing_cases() -> Vec<(&'static str, Step)> {
    let land = |p: &str, off, len, seed| Step::LandingWrite(p.into(), off, len, seed);
    vec![
        ("aligned", land("d2/g", 4096, 4096, 5)),
        ("unaligned", land("d1/f", 100, 50, 6)),
        ("cross", land("d2/g", 3000, 6000, 7)),
        ("append", land("d1/f", 3000, 2000, 8)),
        ("new-levels", land("d1/f", 40 << 20, 5000, 9)),
        ("many-extents", land("d2/g", 0, 300 * BLOCK + 17, 10)),
        ("many-pieces", land("d2/g", 0, 5 << 20, 11)),
        ("preallocated", land("pre", 4096, 20 * BLOCK, 12)),
    ]
}

fn failure_setup() -> Vec<Step> {
    let mut ops = prepared_tree();
    ops.push(Step::Create("pre".into()));
    ops.push(Step::Fallocate("pre".into(), 0, 64 * BLOCK as u64, 0));
    ops
}

/// Every budget check of a landing write (the landing allocation, the log space and
/// map nodes of each commit piece) fails in turn: the write fails, the volume is as
/// before (tree, free blocks and inodes, blocks in use), fsck is clean, and the same
/// write then succeeds with the model's result.
#[test]
fn every_budget_check_of_a_landing_write_fails_cleanly() {
    let mkfs = mkfs_with(512, 64 << 10);
    let vol = memory_volume_with(32 << 20, &mkfs, VolumeConfig::synchronous());
    let mut model0 = Model::new();
    for op in failure_setup() {
        assert_eq!(apply_volume(&vol, &op), model0.apply(&op), "setup {op:?}");
    }
    vol.checkpoint_now().unwrap();
    let img = image_of(&vol);
    vol.abandon();
    let mut injected = 0;
    let mut per_case = Vec::new();
    for (name, op) in landing_cases() {
        let mut n = 1;
        loop {
            let plan = Arc::new(FaultPlan::default());
            let cfg = VolumeConfig {
                faults: Some(plan.clone()),
                ..VolumeConfig::synchronous()
            };
            let v = Volume::open_region(Region::from_image(&img), cfg).unwrap();
            let before = snapshot(&v);
            plan.fail_nth(Some(n));
            let r = apply_volume(&v, &op);
            let seen = plan.seen();
            plan.fail_nth(None);
            let mut model = model0.clone();
            if seen < n {
                assert_eq!(r, model.apply(&op), "{name}");
                assert_eq!(dump_volume(&v).unwrap(), model.dump(), "{name}");
                per_case.push(format!("{name}: {}", n - 1));
                v.abandon();
                break;
            }
            assert!(r.is_err(), "{name}: check {n} failed, the write succeeded");
            assert_eq!(
                snapshot(&v),
                before,
                "{name}: check {n} failed, state changed"
            );
            assert_fsck_clean(&v);
            assert_eq!(apply_volume(&v, &op), model.apply(&op), "{name} after {n}");
            assert_eq!(dump_volume(&v).unwrap(), model.dump(), "{name} after {n}");
            assert_fsck_clean(&v);
            injected += 1;
            n += 1;
            v.abandon();
        }
    }
    println!(
        "landing failure injection: {injected} injected failures, each all-or-nothing; checks per case: {}",
        per_case.join(", ")
    );
    assert!(
        injected >= 2 * landing_cases().len(),
        "too few checks: {injected}"
    );
}

/// A full volume refuses a landing reservation with ENOSPC and changes nothing (a
/// fragmented one: data.rs `a_fragmented_volume_refuses_a_landing_and_changes_nothing`).
#[test]
fn a_full_volume_refuses_a_landing_cleanly() {
    // Full.
    let vol = memory_volume_with(
        4 << 20,
        &mkfs_with(160, 16 << 10),
        VolumeConfig::synchronous(),
    );
    let f = new_file(&vol, ROOT_INO, b"f");
    let big = new_file(&vol, ROOT_INO, b"big");
    let mut at = 0u64;
    while vol.write(&Cred::ROOT, big, at, &[0xF0; BLOCK]).is_ok() {
        at += BLOCK as u64;
    }
    vol.checkpoint_now().unwrap();
    let before = snapshot(&vol);
    let r = vol.reserve_write_landing(&Cred::ROOT, f, 0, 100);
    assert!(matches!(r, Err(FsError::NoSpace)), "{:?}", r.err());
    assert_eq!(snapshot(&vol), before);
    assert_fsck_clean(&vol);
    vol.abandon();
}

/// The server's lane holds a landing reservation across many polls, beyond any borrow
/// of the volume (`reserve_write_landing_shared`): committed, it writes exactly what
/// landed; dropped, it gives back every block and its gaps, as the borrowed one does.
#[test]
fn a_shared_landing_reservation_commits_what_landed_or_gives_everything_back() {
    let (vol, f) = packed_volume();
    let before = snapshot(&vol);
    let (off, len) = (3000u64, 40 * BLOCK + 7);
    // Dropped: nothing changed.
    let r = vol
        .reserve_write_landing_shared(&Cred::ROOT, f, off, len)
        .unwrap();
    assert!(r.is_landing());
    assert!(snapshot(&vol).bfree < before.bfree, "it holds blocks");
    drop(r);
    assert_eq!(snapshot(&vol), before);
    // Held by itself (the caller's handle of the volume gone), landed, committed.
    let data = pattern(off, len, 3);
    let mut r = {
        let v = vol.clone();
        v.reserve_write_landing_shared(&Cred::ROOT, f, off, len)
            .unwrap()
    };
    land_frames(&mut r, off, &data);
    assert_eq!(r.commit().unwrap(), len);
    let mut got = vec![0u8; len];
    assert_eq!(vol.read(f, off, &mut got).unwrap(), len);
    assert!(got == data);
    let mut head = vec![0u8; off as usize];
    vol.read(f, 0, &mut head).unwrap();
    assert!(head == pattern(0, 10_000, 99)[..off as usize]);
    assert_fsck_clean(&vol);
}
