//! A simulator of AF_XDP's measured landing rule, implementing [`FrameIo`] for
//! unprivileged tests (`../shared/research/afxdp.md` §3).
//!
//! Two [`SimEnd`]s joined by a [`SimLink`]: a frame one end transmits is read from its
//! region at once (its address completes immediately) and passes the link's
//! [`Injector`] (test-only loss, duplication, reordering at given rates, seeded). A frame
//! that reaches the other end takes the oldest posted fill address `a` and is written
//! whole, Ethernet header included, at `a + XDP_PACKET_HEADROOM`; the headroom is not
//! written; the RX descriptor says `addr = a + 256` and the length. With no fill entry
//! posted the frame is dropped and counted ([`Counters::no_fill`]); a lost frame takes
//! no fill entry, so later frames land one slot early, as measured. As the kernel
//! (xp_check_unaligned), a fill address `a` with `a + UMEM_CHUNK_SIZE` beyond the region
//! is consumed and skipped ([`Counters::invalid_fill`]) and the frame takes the next.
//! Posted entries cannot be taken back. Ring capacities are the named constants below.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zcfs_xsk::{Desc, FrameIo, Region, UMEM_CHUNK_SIZE, XDP_PACKET_HEADROOM};

use crate::MAX_FRAME_LEN;

/// Entries of the simulated fill ring (libxdp's default ring size).
pub const FILL_RING: usize = 2048;
/// Entries of the simulated RX ring.
pub const RX_RING: usize = 2048;
/// Entries of the simulated TX ring.
pub const TX_RING: usize = 2048;
/// Entries of the simulated completion ring.
pub const COMPLETION_RING: usize = 2048;
/// Link operations a reordered frame is held back at most.
pub const MAX_HOLD: u32 = 8;
/// Frames the kernel sends per kick in copy mode (its TX_BATCH_SIZE), for
/// [`SimEnd::set_tx_batch`].
pub const COPY_MODE_TX_BATCH: usize = 32;

/// Test-only faults on the link: each frame is lost, duplicated or held back (and so
/// overtaken by later frames) with the given probability in parts per million.
#[derive(Clone, Debug)]
pub struct Injector {
    pub loss_ppm: u32,
    pub dup_ppm: u32,
    pub reorder_ppm: u32,
    rng: u64,
}

impl Injector {
    /// A perfect link (the seed only matters for [`Injector::rates`]).
    pub fn none(seed: u64) -> Injector {
        Injector::rates(seed, 0, 0, 0)
    }

    pub fn rates(seed: u64, loss_ppm: u32, dup_ppm: u32, reorder_ppm: u32) -> Injector {
        Injector {
            loss_ppm,
            dup_ppm,
            reorder_ppm,
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    fn next(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn hit(&mut self, ppm: u32) -> bool {
        ppm > 0 && (self.next() % 1_000_000) < ppm as u64
    }
}

/// What the simulator counted, per direction (frames *arriving at* this end).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub sent: u64,
    pub delivered: u64,
    /// Dropped because no fill entry was posted (the kernel's rx_fill_ring_empty_descs).
    pub no_fill: u64,
    /// Dropped because the RX ring was full.
    pub rx_full: u64,
    /// Dropped because the frame is longer than a receive chunk (UMEM_CHUNK_SIZE less
    /// the headroom) holds.
    pub out_of_region: u64,
    /// Fill entries consumed and skipped because their chunk passes the region's end
    /// (the kernel's rx invalid descriptors).
    pub invalid_fill: u64,
    /// Refused at transmit: longer than the MTU or outside the sender's region.
    pub tx_invalid: u64,
    pub injected_loss: u64,
    pub injected_dup: u64,
    pub injected_reorder: u64,
}

struct Side {
    region: Arc<Region>,
    fill: VecDeque<u64>,
    rx: VecDeque<Desc>,
    completions: VecDeque<u64>,
    counters: Counters,
    /// Frames transmitted and not yet sent (only with a TX batch).
    tx: VecDeque<Desc>,
    /// Send at most this many frames per kick (None: every frame at once).
    tx_batch: Option<usize>,
}

struct Link {
    sides: [Side; 2],
    injector: Injector,
    /// Held-back frames: (destination side, bytes, operations left).
    held: Vec<(usize, Vec<u8>, u32)>,
}

impl Link {
    fn arrive(&mut self, to: usize, frame: &[u8]) {
        let s = &mut self.sides[to];
        if s.rx.len() >= RX_RING {
            s.counters.rx_full += 1;
            return;
        }
        if XDP_PACKET_HEADROOM as usize + frame.len() > UMEM_CHUNK_SIZE as usize {
            // Longer than a receive chunk holds: dropped before a fill entry is taken.
            s.counters.out_of_region += 1;
            return;
        }
        // The kernel's xp_check_unaligned: a fill address whose chunk passes the
        // region's end is consumed and skipped, and the frame takes the next entry.
        let a = loop {
            let Some(a) = s.fill.pop_front() else {
                s.counters.no_fill += 1;
                return;
            };
            if a.checked_add(UMEM_CHUNK_SIZE as u64)
                .is_some_and(|end| end <= s.region.len() as u64)
            {
                break a;
            }
            s.counters.invalid_fill += 1;
        };
        let at = a + XDP_PACKET_HEADROOM;
        s.region
            .write(at, frame)
            .expect("a frame that fits a chunk inside the region");
        s.rx.push_back(Desc {
            addr: at,
            len: frame.len() as u32,
        });
        s.counters.delivered += 1;
    }

    /// One link operation: held frames age, and those due arrive.
    fn tick(&mut self) {
        let mut due = Vec::new();
        self.held.retain_mut(|(to, f, left)| {
            if *left == 0 {
                due.push((*to, std::mem::take(f)));
                false
            } else {
                *left -= 1;
                true
            }
        });
        for (to, f) in due {
            self.arrive(to, &f);
        }
    }

    fn send(&mut self, to: usize, frame: Vec<u8>) {
        if self.injector.hit(self.injector.loss_ppm) {
            self.sides[to].counters.injected_loss += 1;
            return;
        }
        let copies = if self.injector.hit(self.injector.dup_ppm) {
            self.sides[to].counters.injected_dup += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            if self.injector.hit(self.injector.reorder_ppm) {
                self.sides[to].counters.injected_reorder += 1;
                let hold = 1 + (self.injector.next() % MAX_HOLD as u64) as u32;
                self.held.push((to, frame.clone(), hold));
            } else {
                self.arrive(to, &frame);
            }
        }
    }
}

/// A simulated link between two ends.
pub struct SimLink;

impl SimLink {
    /// Two ends with zeroed regions of `a_len` and `b_len` bytes.
    pub fn pair(a_len: usize, b_len: usize, injector: Injector) -> (SimEnd, SimEnd) {
        let side = |len: usize| Side {
            region: Arc::new(Region::anonymous(len).expect("anonymous region")),
            fill: VecDeque::new(),
            rx: VecDeque::new(),
            completions: VecDeque::new(),
            counters: Counters::default(),
            tx: VecDeque::new(),
            tx_batch: None,
        };
        let link = Arc::new(Mutex::new(Link {
            sides: [side(a_len), side(b_len)],
            injector,
            held: Vec::new(),
        }));
        let region = |i: usize| link.lock().expect("link").sides[i].region.clone();
        (
            SimEnd {
                link: link.clone(),
                me: 0,
                region: region(0),
            },
            SimEnd {
                region: region(1),
                link,
                me: 1,
            },
        )
    }
}

/// One end of a [`SimLink`]: an AF_XDP socket as the kernel behaves.
pub struct SimEnd {
    link: Arc<Mutex<Link>>,
    me: usize,
    region: Arc<Region>,
}

impl SimEnd {
    fn link(&self) -> std::sync::MutexGuard<'_, Link> {
        self.link.lock().expect("sim link poisoned")
    }

    /// Frames arriving at this end, as counted so far.
    pub fn counters(&self) -> Counters {
        self.link().sides[self.me].counters
    }

    /// Posted fill entries not yet taken by a frame.
    pub fn posted(&self) -> usize {
        self.link().sides[self.me].fill.len()
    }

    /// Frames held back by the injector, not yet arrived.
    pub fn held(&self) -> usize {
        self.link().held.len()
    }

    /// Deliver `frame` to the other end as a neighbour on the segment would send it
    /// (not through this end's rings; the injector does not apply).
    pub fn inject(&self, frame: &[u8]) {
        let mut l = self.link();
        let to = 1 - self.me;
        l.arrive(to, frame);
    }

    /// Change the injector's rates (e.g. a clean link for the end of a test).
    pub fn set_rates(&self, loss_ppm: u32, dup_ppm: u32, reorder_ppm: u32) {
        let mut l = self.link();
        l.injector.loss_ppm = loss_ppm;
        l.injector.dup_ppm = dup_ppm;
        l.injector.reorder_ppm = reorder_ppm;
    }

    /// **A test tool** for the kernel's copy mode: frames given to
    /// [`FrameIo::transmit`] wait in the TX ring, and each kick (a transmit, or a
    /// completions call that finds nothing while the ring holds frames, as
    /// `XskSocket` kicks) sends at most `batch` of them (the kernel sends
    /// [`COPY_MODE_TX_BATCH`]); a frame completes when it is sent. `None`: every frame
    /// is sent at once (the default). Frames then reach the peer long after they were
    /// transmitted, as on a real link under load.
    pub fn set_tx_batch(&self, batch: Option<usize>) {
        let mut l = self.link();
        l.sides[self.me].tx_batch = batch.map(|b| b.max(1));
    }

    /// Frames transmitted and not yet sent (with a TX batch).
    pub fn tx_queued(&self) -> usize {
        self.link().sides[self.me].tx.len()
    }

    /// A new socket on this end's queue and region, as a restarted process opens: the
    /// old socket's rings (posted fill entries, arrived frames, completions) are gone.
    pub fn reopen(&self) -> SimEnd {
        {
            let mut l = self.link();
            let s = &mut l.sides[self.me];
            s.fill.clear();
            s.rx.clear();
            s.completions.clear();
            s.tx.clear();
        }
        SimEnd {
            link: self.link.clone(),
            me: self.me,
            region: self.region.clone(),
        }
    }
}

impl FrameIo for SimEnd {
    fn region(&self) -> &Region {
        &self.region
    }

    fn fill(&mut self, addrs: &[u64]) -> usize {
        let mut l = self.link();
        let s = &mut l.sides[self.me];
        let n = addrs.len().min(FILL_RING - s.fill.len());
        s.fill.extend(&addrs[..n]);
        n
    }

    fn fill_free(&self) -> usize {
        FILL_RING - self.link().sides[self.me].fill.len()
    }

    fn recv(&mut self, out: &mut Vec<Desc>, max: usize) -> usize {
        let mut l = self.link();
        l.tick();
        let s = &mut l.sides[self.me];
        let n = max.min(s.rx.len());
        out.extend(s.rx.drain(..n));
        n
    }

    fn transmit(&mut self, frames: &[Desc]) -> usize {
        let mut l = self.link();
        if l.sides[self.me].tx_batch.is_some() {
            let s = &mut l.sides[self.me];
            let room = COMPLETION_RING
                .min(TX_RING)
                .saturating_sub(s.completions.len() + s.tx.len());
            let n = frames.len().min(room);
            s.tx.extend(&frames[..n]);
            if n > 0 {
                self.kick(&mut l);
            }
            return n;
        }
        self.send_now(&mut l, frames)
    }

    fn completions(&mut self, out: &mut Vec<u64>, max: usize) -> usize {
        let mut l = self.link();
        {
            let s = &l.sides[self.me];
            if s.completions.is_empty() && !s.tx.is_empty() {
                self.kick(&mut l);
            }
        }
        let s = &mut l.sides[self.me];
        let n = max.min(s.completions.len());
        out.extend(s.completions.drain(..n));
        n
    }

    fn wait(&mut self, _timeout: Duration) -> io::Result<bool> {
        let mut l = self.link();
        l.tick();
        Ok(!l.sides[self.me].rx.is_empty())
    }
}

impl SimEnd {
    /// Send up to the TX batch of the frames waiting in the TX ring.
    fn kick(&self, l: &mut Link) {
        let s = &mut l.sides[self.me];
        let k = s.tx_batch.unwrap_or(usize::MAX).min(s.tx.len());
        let batch: Vec<Desc> = s.tx.drain(..k).collect();
        let sent = self.send_now(l, &batch);
        debug_assert_eq!(sent, batch.len(), "queued frames have completion room");
    }

    /// Send `frames` now (each completes at once), as many as the completion ring takes.
    fn send_now(&self, l: &mut Link, frames: &[Desc]) -> usize {
        let to = 1 - self.me;
        let mut n = 0;
        for d in frames {
            if l.sides[self.me].completions.len() >= COMPLETION_RING.min(TX_RING) {
                break;
            }
            let mut bytes = vec![0u8; d.len as usize];
            let ok =
                d.len as usize <= MAX_FRAME_LEN && self.region.read(d.addr, &mut bytes).is_ok();
            l.sides[self.me].completions.push_back(d.addr);
            n += 1;
            if !ok {
                l.sides[to].counters.tx_invalid += 1;
                continue;
            }
            l.sides[to].counters.sent += 1;
            l.send(to, bytes);
            l.tick();
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8, len: usize) -> Vec<u8> {
        vec![tag; len]
    }

    #[test]
    fn with_a_tx_batch_a_kick_sends_at_most_the_batch_and_frames_complete_when_sent() {
        let (mut a, mut b) = SimLink::pair(1 << 20, 1 << 20, Injector::none(1));
        a.set_tx_batch(Some(COPY_MODE_TX_BATCH));
        let fills: Vec<u64> = (0..100u64).map(|i| i * 4096).collect();
        assert_eq!(b.fill(&fills), 100);
        let descs: Vec<Desc> = (0..100u64)
            .map(|i| Desc {
                addr: i * 2048,
                len: 60,
            })
            .collect();
        assert_eq!(a.transmit(&descs), 100, "all taken into the TX ring");
        assert_eq!(a.tx_queued(), 100 - COPY_MODE_TX_BATCH);
        assert_eq!(b.counters().delivered, COPY_MODE_TX_BATCH as u64);
        let mut done = Vec::new();
        // The first call returns the sent batch; a call that finds nothing kicks.
        assert_eq!(a.completions(&mut done, usize::MAX), COPY_MODE_TX_BATCH);
        let mut sent = COPY_MODE_TX_BATCH;
        for _ in 0..10 {
            a.completions(&mut done, usize::MAX);
            sent = done.len();
        }
        assert_eq!(sent, 100);
        assert_eq!(a.tx_queued(), 0);
        assert_eq!(b.counters().delivered, 100);
    }

    #[test]
    fn a_frame_lands_at_fill_plus_headroom_and_the_headroom_is_untouched() {
        let (mut a, mut b) = SimLink::pair(1 << 16, 1 << 16, Injector::none(1));
        b.region().write(0, &[0xCC; 4096]).unwrap();
        assert_eq!(b.fill(&[0]), 1);
        a.region().write(0, &frame(7, 100)).unwrap();
        assert_eq!(a.transmit(&[Desc { addr: 0, len: 100 }]), 1);
        let mut got = Vec::new();
        assert_eq!(b.recv(&mut got, 8), 1);
        assert_eq!(
            got[0],
            Desc {
                addr: 256,
                len: 100
            }
        );
        let mut bytes = [0u8; 4096];
        b.region().read(0, &mut bytes).unwrap();
        assert!(bytes[..256].iter().all(|&v| v == 0xCC));
        assert!(bytes[256..356].iter().all(|&v| v == 7));
        assert!(bytes[356..].iter().all(|&v| v == 0xCC));
        let mut c = Vec::new();
        assert_eq!(a.completions(&mut c, 8), 1);
        assert_eq!(c, [0]);
    }

    #[test]
    fn a_frame_without_a_fill_entry_is_dropped_and_counted() {
        let (mut a, b) = SimLink::pair(1 << 16, 1 << 16, Injector::none(1));
        a.transmit(&[Desc { addr: 0, len: 60 }]);
        assert_eq!(b.counters().no_fill, 1);
        assert_eq!(b.counters().delivered, 0);
    }

    #[test]
    fn a_lost_frame_shifts_every_later_frame_one_slot_early() {
        let (mut a, mut b) = SimLink::pair(1 << 16, 1 << 16, Injector::none(1));
        b.fill(&[0, 4096, 8192]);
        a.region().write(0, &frame(1, 60)).unwrap();
        a.region().write(2048, &frame(2, 60)).unwrap();
        a.set_rates(1_000_000, 0, 0);
        a.transmit(&[Desc { addr: 0, len: 60 }]);
        a.set_rates(0, 0, 0);
        a.transmit(&[Desc {
            addr: 2048,
            len: 60,
        }]);
        let mut got = Vec::new();
        b.recv(&mut got, 8);
        assert_eq!(got, [Desc { addr: 256, len: 60 }]);
        let mut x = [0u8; 1];
        b.region().read(256, &mut x).unwrap();
        assert_eq!(x[0], 2, "frame 2 landed in frame 1's slot");
        assert_eq!(b.posted(), 2);
    }

    #[test]
    fn a_fill_address_whose_chunk_passes_the_region_end_is_skipped_at_the_bound() {
        let len = 1 << 16;
        let (mut a, mut b) = SimLink::pair(len, len, Injector::none(1));
        let last = len as u64 - UMEM_CHUNK_SIZE as u64;
        // The first entry is one byte beyond the bound: consumed and skipped, so the
        // frame takes the next, which is exactly at the bound.
        assert_eq!(b.fill(&[last + 1, last]), 2);
        a.region().write(0, &frame(9, 60)).unwrap();
        assert_eq!(a.transmit(&[Desc { addr: 0, len: 60 }]), 1);
        let mut got = Vec::new();
        assert_eq!(b.recv(&mut got, 8), 1);
        assert_eq!(got[0].addr, last + XDP_PACKET_HEADROOM);
        assert_eq!(b.counters().invalid_fill, 1);
        assert_eq!(b.posted(), 0);
    }

    #[test]
    fn rings_are_bounded_at_their_capacity() {
        let (mut a, mut b) = SimLink::pair(1 << 16, 1 << 16, Injector::none(1));
        let addrs = vec![0u64; FILL_RING + 1];
        assert_eq!(b.fill(&addrs), FILL_RING);
        assert_eq!(b.fill_free(), 0);
        // RX ring: RX_RING frames arrive, the next is dropped as rx_full.
        let descs = vec![Desc { addr: 0, len: 60 }; RX_RING + 1];
        assert_eq!(a.transmit(&descs), (RX_RING + 1).min(COMPLETION_RING));
        let c = b.counters();
        assert_eq!(c.delivered as usize, RX_RING.min(COMPLETION_RING));
        // The completion ring holds COMPLETION_RING; more sends wait for it.
        assert_eq!(a.transmit(&descs[..1]), 0);
        let mut out = Vec::new();
        assert_eq!(a.completions(&mut out, usize::MAX), COMPLETION_RING);
        assert_eq!(a.transmit(&descs[..1]), 1);
        assert_eq!(b.counters().rx_full, 1);
        // A frame longer than the MTU is refused.
        assert_eq!(
            a.transmit(&[Desc {
                addr: 0,
                len: MAX_FRAME_LEN as u32 + 1
            }]),
            1
        );
        assert_eq!(b.counters().tx_invalid, 1);
    }

    #[test]
    fn the_injector_is_seeded_and_hits_its_rates() {
        let (mut a, mut b) =
            SimLink::pair(1 << 16, 1 << 16, Injector::rates(7, 10_000, 10_000, 10_000));
        let n = 20_000;
        let mut out = Vec::new();
        let mut c = Vec::new();
        for _ in 0..n {
            b.fill(&[0]);
            a.transmit(&[Desc { addr: 0, len: 60 }]);
            b.recv(&mut out, 16);
            a.completions(&mut c, 16);
            out.clear();
        }
        let k = b.counters();
        for v in [k.injected_loss, k.injected_dup, k.injected_reorder] {
            assert!((100..400).contains(&v), "{k:?}");
        }
    }
}
