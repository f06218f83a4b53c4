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

fn setup() -> Vec<Op> {
    let mut ops = vec![
        Op::Mkdir("d1".into()),
        Op::Mkdir("d2".into()),
        Op::Mkdir("full".into()),
        Op::Create("d1/f".into()),
        Op::Write("d1/f".into(), 0, 9000, 1),
        Op::Create("d2/g".into()),
        Op::Write("d2/g".into(), 0, 5000, 2),
        Op::Write("d2/g".into(), 8 << 20, 100, 3),
        Op::Link("d1/f".into(), "h".into()),
        Op::Mkdir("d1/sub".into()),
        Op::Symlink("s".into(), "d1/f".into()),
        Op::SetXattr("d1/f".into(), "user.a".into(), vec![1, 2, 3]),
    ];
    // A directory whose one block is full: a new name there needs a new block.
    for i in 0..128 {
        ops.push(Op::Create(format!("full/{i:03}")));
    }
    ops
}

/// Operations whose budget checks are broken in turn.
fn cases() -> Vec<(&'static str, Op)> {
    vec![
        ("create", Op::Create("d1/new".into())),
        ("create-grows-dir", Op::Create("full/new".into())),
        ("mkdir", Op::Mkdir("d2/nd".into())),
        ("mkdir-grows-dir", Op::Mkdir("full/nd".into())),
        ("symlink", Op::Symlink("d2/s2".into(), "../h".into())),
        (
            "symlink-grows-dir",
            Op::Symlink("full/s".into(), "x".into()),
        ),
        ("write-aligned", Op::Write("d2/g".into(), 4096, 8192, 5)),
        ("write-unaligned", Op::Write("d1/f".into(), 100, 50, 6)),
        (
            "write-new-levels",
            Op::Write("d1/f".into(), 40 << 20, 5000, 7),
        ),
        ("write-many-leaves", Op::Write("d2/g".into(), 0, 5 << 20, 8)),
        ("truncate-down", Op::Truncate("d1/f".into(), 5000)),
        ("truncate-sparse", Op::Truncate("d2/g".into(), 4096 + 7)),
        ("truncate-up", Op::Truncate("d1/f".into(), 16 << 20)),
        ("rename-new", Op::Rename("d1/f".into(), "d1/f2".into(), 0)),
        (
            "rename-grows-dir",
            Op::Rename("d1/f".into(), "full/f".into(), 0),
        ),
        ("rename-over", Op::Rename("d2/g".into(), "d1/f".into(), 0)),
        (
            "rename-dir",
            Op::Rename("d1/sub".into(), "d2/sub".into(), 0),
        ),
        (
            "rename-exchange",
            Op::Rename("d1/f".into(), "d2/g".into(), 2),
        ),
        ("link", Op::Link("d2/g".into(), "d1/g2".into())),
        ("link-grows-dir", Op::Link("d2/g".into(), "full/g".into())),
        ("unlink-linked", Op::Unlink("h".into())),
        ("unlink-last", Op::Unlink("d2/g".into())),
        ("rmdir", Op::Rmdir("d1/sub".into())),
        ("chmod", Op::Chmod("d1/f".into(), 0o600)),
        ("chown", Op::Chown("d2/g".into(), 5, 6)),
        (
            "xattr-set",
            Op::SetXattr("d2/g".into(), "user.b".into(), vec![9; 100]),
        ),
        (
            "xattr-remove",
            Op::RemoveXattr("d1/f".into(), "user.a".into()),
        ),
        ("punch-aligned", Op::PunchHole("d2/g".into(), 0, 4096)),
    ]
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
    let mkfs = MkfsOptions {
        inodes: Some(512),
        log_bytes: Some(64 << 10),
    };
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
    let mkfs = MkfsOptions {
        inodes: Some(160),
        log_bytes: Some(16 << 10),
    };
    let vol = memory_volume_with(4 << 20, &mkfs, VolumeConfig::synchronous());
    let mut model = Model::new();
    for op in setup() {
        assert_eq!(apply_volume(&vol, &op), model.apply(&op), "setup {op:?}");
    }
    let o = Owner::default();
    let big = vol.create(ROOT_INO, b"big", 0o644, o, 0).unwrap().ino;
    let mut at = 0u64;
    while vol.write(big, at, &[0xF0; 4096]).is_ok() {
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
        v.create(ROOT_INO, format!("i{i}").as_bytes(), 0o644, o, 0)
            .unwrap();
        i += 1;
    }
    let before = snapshot(&v);
    assert!(matches!(
        v.create(ROOT_INO, b"one-more", 0o644, o, 0),
        Err(FsError::NoInodes)
    ));
    assert!(matches!(
        v.mkdir(ROOT_INO, b"one-more", 0o755, o),
        Err(FsError::NoInodes)
    ));
    assert_eq!(snapshot(&v), before);
    let report = zcfs_volume::fsck::check_volume(&v);
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_pflush_larger_than_the_log_is_refused_before_anything_changes() {
    let mkfs = MkfsOptions {
        inodes: Some(64),
        log_bytes: Some(16 << 10),
    };
    let vol = memory_volume_with(32 << 20, &mkfs, VolumeConfig::synchronous());
    let o = Owner::default();
    let f = vol.create(ROOT_INO, b"f", 0o644, o, 0).unwrap().ino;
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
    let report = zcfs_volume::fsck::check_volume(&vol);
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// The crash enumeration over failing operations: a crash at any fence of a sequence
/// with failures in it recovers to a state of the model, which ignores the failures.
#[test]
fn crash_enumeration_over_failing_operations() {
    let plan = Arc::new(FaultPlan::default());
    let vcfg = cfg(&plan);
    let vol = memory_volume_with(4 << 20, &small_mkfs(), vcfg.clone());
    let mut model = Model::new();
    for op in setup().into_iter().take(12) {
        assert_eq!(apply_volume(&vol, &op), model.apply(&op));
    }
    vol.checkpoint_now().unwrap();
    let ops = [
        Op::Failing(Box::new(Op::Create("d1/x".into())), 1),
        Op::Write("d1/f".into(), 0, 100, 9),
        Op::Failing(Box::new(Op::Write("d2/g".into(), 0, 9000, 4)), 2),
        Op::Failing(Box::new(Op::Rename("d1/f".into(), "d2/g".into(), 0)), 1),
        Op::Create("d1/y".into()),
        Op::Failing(Box::new(Op::Truncate("d1/f".into(), 10)), 1),
        Op::Failing(Box::new(Op::Mkdir("d1/z".into())), 2),
    ];
    let mut states = vec![model.dump()];
    // SAFETY: this thread alone uses the volume while recording.
    unsafe { vol.test_door().start_recording() };
    for (i, op) in ops.iter().enumerate() {
        vol.test_door().mark(i as u64);
        let want = model.apply(op);
        let got = apply_volume(&vol, op);
        if !matches!(op, Op::Failing(..)) {
            assert_eq!(got, want);
        }
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
