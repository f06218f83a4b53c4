//! Failures are all-or-nothing too. Every budget check of every operation type (blocks,
//! inode slots, log space) is made to fail in turn; after each failure the volume equals
//! the volume before the operation (tree, free blocks, free inodes), fsck is clean, and
//! the same operation then succeeds with the model's result. Real exhaustion (a full
//! volume, no inodes left, a transaction larger than the log) is checked the same way,
//! and the crash enumeration runs over failing operations.

mod common;
use common::*;
use std::sync::Arc;
use zcfs_pmem::crash::{for_each_crash_image, CrashConfig};
use zcfs_volume::*;

/// The prepared tree, a sparse far block, and a directory whose one block is full (a
/// new name there needs a new block).
fn setup() -> Vec<Step> {
    let mut ops = prepared_tree();
    ops.push(Step::Write("d2/g".into(), 8 << 20, 100, 3));
    ops.push(Step::Mkdir("full".into()));
    for i in 0..128 {
        ops.push(Step::Create(format!("full/{i:03}")));
    }
    ops
}

/// Operations whose budget checks are broken in turn: each kind once, and those that
/// grow a directory, add map levels or touch many leaves.
fn cases() -> Vec<(&'static str, Step)> {
    let mut c: Vec<_> = single_ops()
        .into_iter()
        .filter(|(_, s)| !s.is_fsync())
        .collect();
    c.extend([
        ("create-grows-dir", Step::Create("full/new".into())),
        ("mkdir-grows-dir", Step::Mkdir("full/nd".into())),
        (
            "symlink-grows-dir",
            Step::Symlink("full/s".into(), "x".into()),
        ),
        (
            "write-new-levels",
            Step::Write("d1/f".into(), 40 << 20, 5000, 7),
        ),
        (
            "write-many-leaves",
            Step::Write("d2/g".into(), 0, 5 << 20, 8),
        ),
        ("truncate-sparse", Step::Truncate("d2/g".into(), 4096 + 7)),
        ("truncate-far-up", Step::Truncate("d1/f".into(), 16 << 20)),
        (
            "rename-grows-dir",
            Step::Rename("d1/f".into(), "full/f".into(), 0),
        ),
        ("link-grows-dir", Step::Link("d2/g".into(), "full/g".into())),
        ("punch-far", Step::PunchHole("d2/g".into(), 8 << 20, 4096)),
        (
            "fallocate-new-levels",
            Step::Fallocate("d1/f".into(), 40 << 20, 3 << 20, 0),
        ),
        (
            "xattr-set-index-form",
            Step::SetXattr("d1/f".into(), "user.big".into(), vec![7; 65536]),
        ),
    ]);
    c
}

/// What must not change when an operation fails.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    tree: Vec<String>,
    bfree: u64,
    ffree: u64,
}

fn snapshot(vol: &Volume) -> Snapshot {
    let s = vol.statfs();
    Snapshot {
        tree: dump_volume(vol).unwrap(),
        bfree: s.bfree,
        ffree: s.ffree,
    }
}

fn cfg(plan: &Arc<FaultPlan>) -> VolumeConfig {
    VolumeConfig {
        faults: Some(plan.clone()),
        ..VolumeConfig::synchronous()
    }
}

fn prepared_image() -> (Vec<u8>, Model) {
    let mkfs = mkfs_with(512, 64 << 10);
    let vol = memory_volume_with(32 << 20, &mkfs, VolumeConfig::synchronous());
    let mut model = Model::new();
    for op in setup() {
        assert_eq!(apply_volume(&vol, &op), model.apply(&op), "setup {op:?}");
    }
    vol.checkpoint_now().unwrap();
    let img = image_of(&vol);
    vol.abandon();
    (img, model)
}

#[test]
fn every_budget_check_of_every_operation_fails_cleanly() {
    let (img, model0) = prepared_image();
    let mut injected = 0;
    let mut points_per_op = Vec::new();
    for (name, op) in cases() {
        let mut n = 1;
        loop {
            let plan = Arc::new(FaultPlan::default());
            let vol = Volume::open_region(Region::from_image(&img), cfg(&plan)).unwrap();
            let before = snapshot(&vol);
            plan.fail_nth(Some(n));
            let r = apply_volume(&vol, &op);
            let seen = plan.seen();
            plan.fail_nth(None);
            if seen < n {
                // The operation passed all its checks: it must have done what the
                // model does.
                let mut model = model0.clone();
                assert_eq!(r, model.apply(&op), "{name}");
                assert_eq!(dump_volume(&vol).unwrap(), model.dump(), "{name}");
                points_per_op.push(format!("{name}: {}", n - 1));
                break;
            }
            assert!(
                r.is_err(),
                "{name}: check {n} failed but the operation succeeded"
            );
            assert_eq!(
                snapshot(&vol),
                before,
                "{name}: check {n} failed, state changed"
            );
            let report = zcfs_volume::fsck::check_volume(&vol);
            assert!(report.is_clean(), "{name} check {n}: {:?}", report.problems);
            // The volume is fine afterwards: the operation now succeeds.
            let mut model = model0.clone();
            assert_eq!(
                apply_volume(&vol, &op),
                model.apply(&op),
                "{name} after {n}"
            );
            assert_eq!(dump_volume(&vol).unwrap(), model.dump(), "{name} after {n}");
            injected += 1;
            n += 1;
            vol.abandon();
        }
    }
    println!(
        "failure injection: {injected} injected failures over {} operation types, each all-or-nothing\n{}",
        cases().len(),
        points_per_op.join(", ")
    );
    assert!(
        injected >= cases().len(),
        "too few checks injected: {injected}"
    );
}

#[test]
fn a_full_volume_and_a_full_inode_table_fail_cleanly() {
    // Fill the volume; then every operation that needs room fails with ENOSPC and
    // changes nothing, and those that need none still work.
    let mkfs = mkfs_with(160, 16 << 10);
    let vol = memory_volume_with(4 << 20, &mkfs, VolumeConfig::synchronous());
    let mut model = Model::new();
    for op in setup() {
        assert_eq!(apply_volume(&vol, &op), model.apply(&op), "setup {op:?}");
    }
    let big = new_file(&vol, ROOT_INO, b"big");
    let mut at = 0u64;
    while vol.write(&Cred::ROOT, big, at, &[0xF0; 4096]).is_ok() {
        at += 4096;
    }
    vol.checkpoint_now().unwrap();
    assert_eq!(vol.statfs().bfree, 0);
    let img = image_of(&vol);
    vol.abandon();
    let mut enospc = 0;
    for (name, op) in cases() {
        let v = Volume::open_region(Region::from_image(&img), VolumeConfig::synchronous()).unwrap();
        let before = snapshot(&v);
        match apply_volume(&v, &op) {
            Err(e) if e == libc::ENOSPC => {
                assert_eq!(snapshot(&v), before, "{name}: ENOSPC changed the state");
                enospc += 1;
            }
            Err(e) => panic!("{name}: errno {e} on a full volume"),
            Ok(()) => {} // needed no new block
        }
        let report = zcfs_volume::fsck::check_volume(&v);
        assert!(report.is_clean(), "{name}: {:?}", report.problems);
        v.abandon();
    }
    println!(
        "full volume: {enospc} of {} operations refused with ENOSPC",
        cases().len()
    );
    assert!(enospc >= 10, "only {enospc} operations needed room?");
    // Inodes: use them all; the next create fails and changes nothing.
    let v = memory_volume_with(4 << 20, &mkfs, VolumeConfig::default());
    let mut i = 0;
    while v.statfs().ffree > 0 {
        v.create(&Cred::ROOT, ROOT_INO, format!("i{i}").as_bytes(), 0o644, 0)
            .unwrap();
        i += 1;
    }
    let before = snapshot(&v);
    assert!(matches!(
        v.create(&Cred::ROOT, ROOT_INO, b"one-more", 0o644, 0),
        Err(FsError::NoInodes)
    ));
    assert!(matches!(
        v.mkdir(&Cred::ROOT, ROOT_INO, b"one-more", 0o755),
        Err(FsError::NoInodes)
    ));
    assert_eq!(snapshot(&v), before);
    assert_fsck_clean(&v);
}

#[test]
fn a_pflush_larger_than_the_log_is_refused_before_anything_changes() {
    let mkfs = mkfs_with(64, 16 << 10);
    let vol = memory_volume_with(32 << 20, &mkfs, VolumeConfig::synchronous());
    let f = new_file(&vol, ROOT_INO, b"f");
    let before = snapshot(&vol);
    let mut t = PflushTxn::default();
    // 2,000 pages: 16 KB of pointers, more than half the 16 KiB ring.
    let pages = vol.reserve_pages(2000).unwrap();
    t.pflush_add(f, 0, pages, None).unwrap();
    let r = vol.pflush_commit(t);
    assert!(
        matches!(r, Err(FsError::TransactionTooLarge { .. })),
        "{:?}",
        r.err()
    );
    assert_eq!(snapshot(&vol), before, "a refused pflush changed the state");
    // A set that fits commits, and atomically.
    let mut t = PflushTxn::default();
    let mut pages = vol.reserve_pages(100).unwrap();
    for i in 0..100 {
        pages.page_mut(i).fill(i as u8);
    }
    t.pflush_add(f, 0, pages, None).unwrap();
    vol.pflush_commit(t).unwrap();
    assert_eq!(vol.getattr(f).unwrap().size, 100 * 4096);
    assert_fsck_clean(&vol);
}

/// The crash enumeration over failing operations: a crash at any fence of a sequence
/// with failures in it recovers to a state of the model, which ignores the failures.
#[test]
fn crash_enumeration_over_failing_operations() {
    let plan = Arc::new(FaultPlan::default());
    let vcfg = cfg(&plan);
    let vol = memory_volume_with(4 << 20, &small_mkfs(), vcfg.clone());
    let mut model = Model::new();
    for op in prepared_tree() {
        assert_eq!(apply_volume(&vol, &op), model.apply(&op));
    }
    vol.checkpoint_now().unwrap();
    let ops = [
        Step::Failing(Box::new(Step::Create("d1/x".into())), 1),
        Step::Write("d1/f".into(), 0, 100, 9),
        Step::Failing(Box::new(Step::Write("d2/g".into(), 0, 9000, 4)), 2),
        Step::Failing(Box::new(Step::Rename("d1/f".into(), "d2/g".into(), 0)), 1),
        Step::Create("d1/y".into()),
        Step::Failing(Box::new(Step::Truncate("d1/f".into(), 10)), 1),
        Step::Failing(Box::new(Step::Mkdir("d1/z".into())), 2),
        // Landing reservations (layer 2): the landing allocation, the log space and
        // the map blocks of its commit failing; then one that commits.
        Step::Failing(Box::new(Step::LandingWrite("d2/g".into(), 0, 9000, 5)), 1),
        Step::Failing(Box::new(Step::LandingWrite("d1/f".into(), 100, 50, 6)), 2),
        Step::Failing(
            Box::new(Step::LandingWrite("d2/g".into(), 3000, 6000, 7)),
            3,
        ),
        Step::LandingWrite("d2/g".into(), 3000, 6000, 8),
    ];
    let mut states = vec![model.dump()];
    // SAFETY: this thread alone uses the volume while recording.
    unsafe { vol.test_door().start_recording() };
    for (i, op) in ops.iter().enumerate() {
        vol.test_door().mark(i as u64);
        apply_both(&mut model, &vol, op, &format!("op {i}"));
        states.push(model.dump());
    }
    let rec = vol.test_door().take_recording().unwrap();
    vol.abandon();
    let mut n = 0;
    let mut bad = Vec::new();
    for_each_crash_image(&rec, &CrashConfig::default(), |pt, img| {
        n += 1;
        let started = pt.marks.len();
        let v = Volume::open_region(Region::from_image(img), VolumeConfig::synchronous()).unwrap();
        v.abandon();
        let r = zcfs_volume::fsck::check_volume(&v);
        let dump = dump_volume(&v).unwrap();
        let lo = started.saturating_sub(1);
        if !r.is_clean() || !(lo..=started).any(|j| states[j] == dump) {
            bad.push(format!(
                "fence {} ({started} ops): {:?}",
                pt.fence, r.problems
            ));
        }
        bad.len() < 5
    });
    println!(
        "crash suite failing-ops: {n} states, {} violations",
        bad.len()
    );
    assert!(bad.is_empty(), "{bad:#?}");
}
