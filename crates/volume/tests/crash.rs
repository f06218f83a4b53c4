//! Crash consistency against the persistence model (shared CRASH-TESTING.md).
//!
//! Every workload runs under recording; at each fence (and at the end) every image a
//! power failure could leave is built (durable state + every prefix of the in-flight
//! lines, every single line in every version, pairs, seeded random subsets), recovered,
//! and checked: it mounts, fsck is clean, the tree equals the oracle's state after some
//! operation between the last one known durable and the one in progress. A sample of
//! images is also crashed again during its own recovery and recovered a second time.

mod common;
use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use zcfs_pmem::crash::{for_each_crash_image, CrashConfig};
use zcfs_volume::{CommitFault, FsError, MkfsOptions, Region, Volume, VolumeConfig, ROOT_INO};

const ACK: u64 = 1 << 32;
const SIZE: usize = 512 << 10;

#[derive(Default)]
struct Outcome {
    states: usize,
    recovery_states: usize,
    violations: Vec<String>,
}

struct Run<'a> {
    name: &'a str,
    mkfs: MkfsOptions,
    vcfg: VolumeConfig,
    crash: CrashConfig,
    /// Every n-th image is also crashed during its own recovery (0 = never).
    recovery_every: usize,
}

fn sync_cfg() -> VolumeConfig {
    VolumeConfig::synchronous()
}

fn batched_cfg() -> VolumeConfig {
    VolumeConfig {
        batch_ops: 4,
        batch_delay: std::time::Duration::from_secs(3600),
        ..VolumeConfig::default()
    }
}

fn recover_and_check(img: &[u8]) -> Result<(std::sync::Arc<Volume>, Vec<String>), String> {
    let vol = Volume::open_region(Region::from_image(img), sync_cfg())
        .map_err(|e| format!("mount failed: {e}"))?;
    vol.abandon();
    let report = zcfs_volume::fsck::check_volume(&vol);
    if !report.is_clean() {
        return Err(format!("fsck: {:?}", report.problems));
    }
    let dump = dump_volume(&vol).map_err(|e| format!("reading the tree failed: {e}"))?;
    Ok((vol, dump))
}

fn run(r: &Run, setup: &[Step], ops: &[Step]) -> Outcome {
    let vol = memory_volume_with(SIZE, &r.mkfs, r.vcfg.clone());
    let mut model = Model::new();
    for op in setup {
        assert_eq!(apply_volume(&vol, op), model.apply(op), "setup {op:?}");
    }
    vol.checkpoint_now().unwrap();
    let mut states = vec![model.dump()];
    // durable_upto[i]: ops known durable once op i is acknowledged.
    let mut durable_upto = Vec::new();
    let synchronous = r.vcfg.batch_ops == 1;
    let mut last_durable = 0;
    // SAFETY: this thread alone uses the volume while recording.
    unsafe { vol.test_door().start_recording() };
    for (i, op) in ops.iter().enumerate() {
        vol.test_door().mark(i as u64);
        apply_both(&mut model, &vol, op, &format!("{}: op {i}", r.name));
        states.push(model.dump());
        if synchronous || op.is_fsync() {
            last_durable = i + 1;
        }
        durable_upto.push(last_durable);
        vol.test_door().mark(ACK + i as u64);
    }
    let rec = vol.test_door().take_recording().unwrap();
    vol.abandon();
    drop(vol);

    let mut out = Outcome::default();
    let images = AtomicUsize::new(0);
    for_each_crash_image(&rec, &r.crash, |pt, img| {
        let started = pt.marks.iter().filter(|&&m| m < ACK).count();
        let acked = pt.marks.iter().filter(|&&m| m >= ACK).count();
        let lo = if acked == 0 {
            0
        } else {
            durable_upto[acked - 1]
        };
        let n = images.fetch_add(1, Ordering::Relaxed);
        out.states += 1;
        let where_ = format!(
            "{} fence {} (ops started {started}, acked {acked}) image {n} seed {:#x}",
            r.name, pt.fence, r.crash.seed
        );
        match recover_and_check(img) {
            Err(e) => out.violations.push(format!("{where_}: {e}")),
            Ok((_vol, dump)) => {
                if !(lo..=started).any(|j| states[j] == dump) {
                    out.violations.push(format!(
                        "{where_}: recovered tree matches no state in {lo}..={started}\n got: {dump:#?}\n last allowed: {:#?}",
                        states[started]
                    ));
                } else if r.recovery_every > 0 && n.is_multiple_of(r.recovery_every) {
                    crash_during_recovery(img, &dump, &where_, &mut out);
                }
            }
        }
        out.violations.len() < 5
    });
    out
}

/// Recover under recording, crash at every fence of the recovery, recover again: the
/// result must be the same tree as an uninterrupted recovery.
fn crash_during_recovery(img: &[u8], expected: &[String], where_: &str, out: &mut Outcome) {
    let region = Region::from_image(img);
    // SAFETY: this thread alone uses the region while recording.
    unsafe { region.start_recording() };
    let vol = match Volume::open_region(region, sync_cfg()) {
        Ok(v) => v,
        Err(e) => {
            out.violations
                .push(format!("{where_}: recording recovery failed: {e}"));
            return;
        }
    };
    let rec = vol.test_door().take_recording().unwrap();
    vol.abandon();
    drop(vol);
    let cfg = CrashConfig {
        pair_limit: 8,
        sampled_pairs: 16,
        random_subsets: 4,
        seed: 7,
    };
    for_each_crash_image(&rec, &cfg, |_, img2| {
        out.recovery_states += 1;
        match recover_and_check(img2) {
            Err(e) => out
                .violations
                .push(format!("{where_}, crash during recovery: {e}")),
            Ok((_, dump)) if dump != expected => out.violations.push(format!(
                "{where_}, crash during recovery: tree differs from a clean recovery"
            )),
            Ok(_) => {}
        }
        out.violations.len() < 5
    });
}

fn full() -> CrashConfig {
    CrashConfig::default()
}

fn reduced() -> CrashConfig {
    CrashConfig {
        pair_limit: 12,
        sampled_pairs: 48,
        random_subsets: 6,
        seed: 0xc0ffee,
    }
}

fn report(suite: &str, outcomes: Vec<Outcome>) {
    let states: usize = outcomes.iter().map(|o| o.states).sum();
    let rec: usize = outcomes.iter().map(|o| o.recovery_states).sum();
    let violations: Vec<&String> = outcomes.iter().flat_map(|o| &o.violations).collect();
    println!(
        "crash suite {suite}: {states} states (+{rec} crashed during recovery), {} violations",
        violations.len()
    );
    if !violations.is_empty() {
        panic!("{} violations, first: {}", violations.len(), violations[0]);
    }
}

#[test]
fn seq1_every_operation_alone_synchronous() {
    let setup = prepared_tree();
    let mut outs = Vec::new();
    for (name, op) in single_ops() {
        let r = Run {
            name,
            mkfs: small_mkfs(),
            vcfg: sync_cfg(),
            crash: full(),
            recovery_every: 7,
        };
        outs.push(run(&r, &setup, &[op]));
    }
    report("seq-1 synchronous", outs);
}

#[test]
fn seq1_every_operation_alone_batched() {
    let setup = prepared_tree();
    let mut outs = Vec::new();
    for (name, op) in single_ops() {
        // The op, then an fsync: before the fsync returns either state is allowed, after
        // it only the new one.
        let ops = [op, Step::Fsync("s".into())];
        let r = Run {
            name,
            mkfs: small_mkfs(),
            vcfg: batched_cfg(),
            crash: full(),
            recovery_every: 11,
        };
        outs.push(run(&r, &setup, &ops));
    }
    report("seq-1 batched", outs);
}

#[test]
fn seq2_every_ordered_pair() {
    let setup = prepared_tree();
    let ops = single_ops();
    let mut outs = Vec::new();
    for (a, opa) in &ops {
        for (b, opb) in &ops {
            let name = format!("{a}+{b}");
            let r = Run {
                name: &name,
                mkfs: small_mkfs(),
                vcfg: sync_cfg(),
                crash: reduced(),
                recovery_every: 0,
            };
            outs.push(run(&r, &setup, &[opa.clone(), opb.clone()]));
        }
    }
    report("seq-2", outs);
}

#[test]
fn checkpoint_and_log_wrap_under_crash() {
    // A 16 KiB ring: these operations checkpoint and wrap the log several times.
    let mkfs = mkfs_with(64, 16 << 10);
    let mut ops = Vec::new();
    for i in 0..24u32 {
        ops.push(Step::Chmod("d1/f".into(), 0o600 + i));
        ops.push(Step::Create(format!("d2/c{i}")));
        ops.push(Step::Write(
            format!("d2/c{i}"),
            0,
            100 + i as usize * 37,
            i as u8,
        ));
    }
    let r = Run {
        name: "checkpoint",
        mkfs,
        vcfg: sync_cfg(),
        crash: reduced(),
        recovery_every: 13,
    };
    report("checkpoint/wrap", vec![run(&r, &prepared_tree(), &ops)]);
}

#[test]
fn random_sequences() {
    // Seeded generator of longer sequences over the prepared tree.
    let ops = single_ops();
    let mut outs = Vec::new();
    let mut rng = zcfs_pmem::crash::Rng::new(0x5e9);
    for round in 0..24 {
        let seq: Vec<Step> = (0..6)
            .map(|_| ops[rng.below(ops.len())].1.clone())
            .collect();
        let name = format!("random-{round}");
        let vcfg = if round % 2 == 0 {
            sync_cfg()
        } else {
            batched_cfg()
        };
        let r = Run {
            name: &name,
            mkfs: small_mkfs(),
            vcfg,
            crash: reduced(),
            recovery_every: 0,
        };
        outs.push(run(&r, &prepared_tree(), &seq));
    }
    report("random sequences", outs);
}

#[test]
fn crash_during_mkfs_leaves_no_volume_or_an_empty_one() {
    let mut region = Region::anonymous(SIZE);
    // SAFETY: this thread alone uses the region while recording.
    unsafe { region.start_recording() };
    Volume::mkfs_region(&mut region, &small_mkfs()).unwrap();
    let rec = region.take_recording().unwrap();
    let mut states = 0;
    let mut bad = Vec::new();
    for_each_crash_image(&rec, &full(), |_, img| {
        states += 1;
        match Volume::open_region(Region::from_image(img), sync_cfg()) {
            Err(FsError::NotZcfs) => {}
            Err(e) => bad.push(format!("mount: {e}")),
            Ok(v) => {
                v.abandon();
                let r = zcfs_volume::fsck::check_volume(&v);
                if !r.is_clean() || v.dir_len(ROOT_INO).unwrap() != 0 {
                    bad.push(format!("{:?}", r.problems));
                }
            }
        }
        true
    });
    println!(
        "crash suite mkfs: {states} states, {} violations",
        bad.len()
    );
    assert!(bad.is_empty(), "{bad:?}");
}

/// The suite must be able to fail: with a flush or fence removed from the commit path
/// it has to find violations.
#[test]
fn mutation_check_suite_detects_missing_flush_and_fence() {
    for fault in [CommitFault::SkipDataFlush, CommitFault::SkipFenceBeforeTail] {
        let vcfg = VolumeConfig {
            fault: Some(fault),
            ..sync_cfg()
        };
        let mut found = 0;
        let mut states = 0;
        for (name, op) in single_ops() {
            let r = Run {
                name,
                mkfs: small_mkfs(),
                vcfg: vcfg.clone(),
                crash: reduced(),
                recovery_every: 0,
            };
            let o = run(&r, &prepared_tree(), &[op]);
            states += o.states;
            found += o.violations.len();
        }
        println!("mutation {fault:?}: {states} states, {found} violations found (must be > 0)");
        assert!(found > 0, "crash suite did not notice {fault:?}");
    }
}

/// Landing reservations (layer-2 writes, issue 12): the write's blocks land whole with
/// junk around the write, the bytes in front of every extent are clobbered by stores
/// nobody flushes, then commit. Every crash state recovers to the state before or after
/// the write; the gaps (never in a log record) are free after recovery (fsck: the
/// allocator and the inodes agree), as are the blocks of an aborted reservation.
fn landing_ops() -> Vec<(&'static str, Step)> {
    let land = |p: &str, off, len, seed| Step::LandingWrite(p.into(), off, len, seed);
    vec![
        ("land-aligned", land("d2/g", 4096, 4096, 5)),
        ("land-unaligned", land("d1/f", 100, 50, 6)),
        ("land-cross", land("d2/g", 3000, 6000, 7)),
        ("land-append", land("d1/f", 3000, 2000, 8)),
        ("land-overwrite", land("d1/f", 0, 3000, 9)),
        // 41 file blocks: two extents, two gaps.
        ("land-two-extents", land("d1/f", 1000, 40 * 4096, 10)),
        ("land-abort", Step::LandingAbort("d2/g".into(), 0, 9000, 11)),
    ]
}

#[test]
fn seq1_landing_writes_synchronous_and_batched() {
    let setup = prepared_tree();
    let mut outs = Vec::new();
    for (name, op) in landing_ops() {
        for batched in [false, true] {
            let (vcfg, ops) = if batched {
                (batched_cfg(), vec![op.clone(), Step::Fsync("s".into())])
            } else {
                (sync_cfg(), vec![op.clone()])
            };
            let r = Run {
                name,
                mkfs: small_mkfs(),
                vcfg,
                crash: full(),
                recovery_every: 7,
            };
            outs.push(run(&r, &setup, &ops));
        }
    }
    // A landing write after and before each other kind of operation.
    for (a, opa) in single_ops() {
        let name = format!("{a}+land");
        let r = Run {
            name: &name,
            mkfs: small_mkfs(),
            vcfg: sync_cfg(),
            crash: reduced(),
            recovery_every: 0,
        };
        let land = Step::LandingWrite("d2/g".into(), 3000, 6000, 12);
        outs.push(run(&r, &setup, &[opa.clone(), land.clone()]));
        outs.push(run(&r, &setup, &[land, opa]));
    }
    report("landing writes", outs);
}

/// The landing suite can fail: without the write-back of the landed blocks at commit
/// (a test-only switch) it finds violations.
#[test]
fn mutation_check_landing_suite_detects_missing_data_flush() {
    let vcfg = VolumeConfig {
        fault: Some(CommitFault::SkipDataFlush),
        ..sync_cfg()
    };
    let mut found = 0;
    let mut states = 0;
    for (name, op) in landing_ops() {
        let r = Run {
            name,
            mkfs: small_mkfs(),
            vcfg: vcfg.clone(),
            crash: reduced(),
            recovery_every: 0,
        };
        let o = run(&r, &prepared_tree(), &[op]);
        states += o.states;
        found += o.violations.len();
    }
    println!("mutation SkipDataFlush on landing writes: {states} states, {found} violations found (must be > 0)");
    assert!(
        found > 0,
        "the landing crash suite did not notice SkipDataFlush"
    );
}
