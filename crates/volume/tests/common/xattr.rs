//! Xattr helpers of the xattr suites, as root.

use std::collections::BTreeMap;
use zcfs_volume::*;

const R: &Cred = &Cred::ROOT;

/// Set `name` to `value` on `ino` (create or replace).
pub fn set(vol: &Volume, ino: u64, name: &[u8], value: &[u8]) -> Result<()> {
    vol.setxattr(R, ino, name, value, XattrMode::Any)
}

/// Every xattr of `ino`, by name.
pub fn all_of(vol: &Volume, ino: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    vol.listxattr(R, ino)
        .unwrap()
        .into_iter()
        .map(|n| {
            let v = vol.getxattr(R, ino, &n).unwrap();
            (n, v)
        })
        .collect()
}

/// The blocks `ino` owns, in volume blocks.
pub fn blocks_of(vol: &Volume, ino: u64) -> u64 {
    vol.getattr(ino).unwrap().blocks / (BLOCK as u64 / 512)
}

/// Every crash image of `rec` (chosen by `cfg`) must mount, pass fsck and show one of
/// `states` that `accepted(started)` allows, `started` being the changes begun at the
/// crash; `snapshot` reads a state off a recovered volume. Prints how many images were
/// checked (as the crash suites do) and fails with the first violations.
pub fn every_crash_image_recovers_to_a_state<S: PartialEq + std::fmt::Debug>(
    what: &str,
    rec: &zcfs_pmem::Recording,
    cfg: &zcfs_pmem::crash::CrashConfig,
    states: &[S],
    accepted: impl Fn(usize) -> std::ops::RangeInclusive<usize>,
    snapshot: impl Fn(&Volume) -> S,
) {
    let mut n = 0;
    let mut bad = Vec::new();
    zcfs_pmem::crash::for_each_crash_image(rec, cfg, |pt, img| {
        n += 1;
        let started = pt.marks.len();
        let v = Volume::open_region(Region::from_image(img), VolumeConfig::synchronous()).unwrap();
        v.abandon();
        let r = fsck::check_volume(&v);
        let now = snapshot(&v);
        if !r.is_clean() || !accepted(started).any(|j| states[j] == now) {
            bad.push(format!(
                "fence {} ({started} changes): {:?} now {now:?}",
                pt.fence, r.problems
            ));
        }
        bad.len() < 5
    });
    println!("crash suite {what}: {n} states, {} violations", bad.len());
    assert!(n > 0 && bad.is_empty(), "{bad:#?}");
}
