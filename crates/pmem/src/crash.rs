//! Builds the images a power failure could leave, from a [`Recording`].
//!
//! The model (see shared CRASH-TESTING.md): per 64-byte cache line, stores since the
//! line was last durable are *in flight*; a flush after a store marks that version as
//! written back, and the next fence makes it durable. A crash may persist any subset of
//! in-flight lines, each with any of its stored versions. At every fence, and at the
//! end of the trace, this enumerates: the durable state alone; the durable state plus
//! every prefix of the in-flight lines in program order; every single line in every
//! version; every pair of lines (all pairs up to `pair_limit` lines, else a seeded
//! sample); and seeded random subsets. Identical images at one point are visited once.

use crate::{Event, Recording, CACHE_LINE};
use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};

#[derive(Debug, Clone)]
pub struct CrashConfig {
    /// Enumerate all pairs when at most this many lines are in flight.
    pub pair_limit: usize,
    /// Otherwise sample this many pairs.
    pub sampled_pairs: usize,
    /// Random subsets per crash point.
    pub random_subsets: usize,
    /// Seed of the sampling, printed on failure so a run can be replayed.
    pub seed: u64,
}

impl Default for CrashConfig {
    fn default() -> Self {
        CrashConfig {
            pair_limit: 40,
            sampled_pairs: 400,
            random_subsets: 16,
            seed: 0x5eed,
        }
    }
}

/// Where in the trace a crash image comes from.
#[derive(Debug, Clone)]
pub struct CrashPoint {
    /// Fences executed before this point.
    pub fence: usize,
    /// Markers seen before this point, in order.
    pub marks: Vec<u64>,
    /// Lines in flight here.
    pub in_flight: usize,
    /// True for the point after the last event.
    pub at_end: bool,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct CrashStats {
    pub points: usize,
    pub images: usize,
}

struct Pending {
    versions: Vec<Box<[u8]>>,
    /// Index of the newest version covered by a write-back.
    flushed: Option<usize>,
    order: usize,
}

/// Small deterministic PRNG (xorshift64*), so sampling is replayable from the seed.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Visit every crash image of the recording. `visit` returns false to stop early.
pub fn for_each_crash_image(
    rec: &Recording,
    cfg: &CrashConfig,
    mut visit: impl FnMut(&CrashPoint, &[u8]) -> bool,
) -> CrashStats {
    let mut view = rec.base.clone();
    let mut durable = rec.base.clone();
    let mut pending: BTreeMap<usize, Pending> = BTreeMap::new();
    let mut order = 0usize;
    let mut marks = Vec::new();
    let mut fences = 0usize;
    let mut out = Sampling {
        rng: Rng::new(cfg.seed),
        scratch: durable.clone(),
        stats: CrashStats::default(),
    };

    for ev in &rec.events {
        match ev {
            Event::Store { off, data } => {
                view[*off..*off + data.len()].copy_from_slice(data);
                for line in lines(*off, data.len()) {
                    let s = line * CACHE_LINE;
                    let e = (s + CACHE_LINE).min(view.len());
                    let p = pending.entry(line).or_insert_with(|| {
                        order += 1;
                        Pending {
                            versions: Vec::new(),
                            flushed: None,
                            order,
                        }
                    });
                    p.versions.push(view[s..e].into());
                }
            }
            Event::Flush { off, len } => {
                for line in lines(*off, *len) {
                    if let Some(p) = pending.get_mut(&line) {
                        p.flushed = Some(p.versions.len() - 1);
                    }
                }
            }
            Event::Mark(t) => marks.push(*t),
            Event::Fence => {
                let point = CrashPoint {
                    fence: fences,
                    marks: marks.clone(),
                    in_flight: pending.len(),
                    at_end: false,
                };
                if !emit(&point, &durable, &pending, cfg, &mut out, &mut visit) {
                    return out.stats;
                }
                fences += 1;
                pending.retain(|&line, p| match p.flushed {
                    None => true,
                    Some(i) => {
                        let s = line * CACHE_LINE;
                        durable[s..s + p.versions[i].len()].copy_from_slice(&p.versions[i]);
                        p.versions.drain(..=i);
                        p.flushed = None;
                        !p.versions.is_empty()
                    }
                });
            }
        }
    }
    let point = CrashPoint {
        fence: fences,
        marks,
        in_flight: pending.len(),
        at_end: true,
    };
    emit(&point, &durable, &pending, cfg, &mut out, &mut visit);
    out.stats
}

fn lines(off: usize, len: usize) -> std::ops::RangeInclusive<usize> {
    if len == 0 {
        #[allow(clippy::reversed_empty_ranges)]
        return 1..=0;
    }
    off / CACHE_LINE..=(off + len - 1) / CACHE_LINE
}

/// What emitting crash images carries from one crash point to the next.
struct Sampling {
    rng: Rng,
    /// The image being assembled (as large as the region).
    scratch: Vec<u8>,
    stats: CrashStats,
}

fn emit(
    point: &CrashPoint,
    durable: &[u8],
    pending: &BTreeMap<usize, Pending>,
    cfg: &CrashConfig,
    out: &mut Sampling,
    visit: &mut impl FnMut(&CrashPoint, &[u8]) -> bool,
) -> bool {
    out.stats.points += 1;
    let mut in_flight: Vec<(usize, &Pending)> = pending.iter().map(|(l, p)| (*l, p)).collect();
    in_flight.sort_by_key(|(_, p)| p.order);
    let n = in_flight.len();
    // Each candidate is a list of (index into in_flight, version).
    let mut candidates: Vec<Vec<(usize, usize)>> = vec![vec![]];
    let latest = |i: usize| (i, in_flight[i].1.versions.len() - 1);
    for p in 1..=n {
        candidates.push((0..p).map(latest).collect());
    }
    for (i, (_, p)) in in_flight.iter().enumerate() {
        for v in 0..p.versions.len() {
            candidates.push(vec![(i, v)]);
        }
    }
    if n <= cfg.pair_limit {
        for i in 0..n {
            for j in i + 1..n {
                candidates.push(vec![latest(i), latest(j)]);
            }
        }
    } else {
        for _ in 0..cfg.sampled_pairs {
            let (i, j) = (out.rng.below(n), out.rng.below(n));
            if i != j {
                candidates.push(vec![latest(i), latest(j)]);
            }
        }
    }
    if n > 2 {
        for _ in 0..cfg.random_subsets {
            let mut pick = Vec::new();
            for (i, (_, p)) in in_flight.iter().enumerate() {
                if out.rng.next_u64() & 1 == 1 {
                    pick.push((i, out.rng.below(p.versions.len())));
                }
            }
            candidates.push(pick);
        }
    }

    let mut seen = HashSet::new();
    for cand in candidates {
        // Fingerprint of what differs from the durable image, to skip duplicates.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for &(i, v) in &cand {
            let (line, p) = in_flight[i];
            let s = line * CACHE_LINE;
            let content = &p.versions[v];
            if **content != durable[s..s + content.len()] {
                line.hash(&mut h);
                content.hash(&mut h);
            }
        }
        if !seen.insert(h.finish()) {
            continue;
        }
        out.scratch.copy_from_slice(durable);
        for &(i, v) in &cand {
            let (line, p) = in_flight[i];
            let s = line * CACHE_LINE;
            out.scratch[s..s + p.versions[v].len()].copy_from_slice(&p.versions[v]);
        }
        out.stats.images += 1;
        if !visit(point, &out.scratch) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Region;

    fn images_at_end(rec: &Recording) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for_each_crash_image(rec, &CrashConfig::default(), |p, img| {
            if p.at_end {
                out.push(img.to_vec());
            }
            true
        });
        out
    }

    /// The crash images at the end of what `steps` do to a fresh recorded region.
    fn images_after(steps: impl FnOnce(&Region)) -> Vec<Vec<u8>> {
        let r = Region::anonymous(8192);
        // SAFETY: single-threaded test.
        unsafe { r.start_recording() };
        steps(&r);
        images_at_end(&r.take_recording().unwrap())
    }

    /// A plain store, recorded.
    fn store(r: &Region, off: usize, bytes: &[u8]) {
        // SAFETY: single-threaded test: no other access to the region.
        unsafe { r.write(off, bytes) };
    }

    #[test]
    fn unflushed_store_may_or_may_not_persist() {
        let imgs = images_after(|r| store(r, 0, &[1]));
        assert!(imgs.iter().any(|i| i[0] == 0));
        assert!(imgs.iter().any(|i| i[0] == 1));
    }

    #[test]
    fn flushed_and_fenced_store_is_durable() {
        let imgs = images_after(|r| {
            store(r, 0, &[1]);
            r.persist(0, 1).unwrap();
        });
        assert!(!imgs.is_empty());
        assert!(imgs.iter().all(|i| i[0] == 1));
    }

    #[test]
    fn ordering_violation_is_visible() {
        // Data then commit flag, flag flushed but data not: some image has the flag
        // without the data - the bug the crash suite must be able to see.
        let imgs = images_after(|r| {
            store(r, 0, &[7]);
            store(r, 128, &[1]);
            r.persist(128, 1).unwrap();
        });
        assert!(imgs.iter().any(|i| i[128] == 1 && i[0] == 0));
    }

    #[test]
    fn raw_slice_stores_are_seen_at_flush() {
        let imgs = images_after(|r| {
            // SAFETY: single-threaded test, exclusive range.
            unsafe { r.slice_mut(4096, 3) }.copy_from_slice(&[5, 6, 7]);
            r.persist(4096, 3).unwrap();
        });
        assert!(imgs.iter().all(|i| i[4096..4099] == [5, 6, 7]));
    }

    #[test]
    fn older_versions_of_a_line_are_enumerated() {
        let imgs = images_after(|r| {
            store(r, 0, &[1]);
            r.flush(0, 1);
            store(r, 0, &[2]);
            r.fence().unwrap();
        });
        // The first version was written back and fenced: durable. The second is in flight.
        assert!(imgs.iter().all(|i| i[0] == 1 || i[0] == 2));
        assert!(imgs.iter().any(|i| i[0] == 1) && imgs.iter().any(|i| i[0] == 2));
    }
}
