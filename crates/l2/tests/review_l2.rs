//! Adversarial review of zcfs-l2 (review rv4): each test states a property the protocol
//! must have; the ones marked `#[ignore = "finding: ..."]` fail on the code as reviewed.
//! Simulated time only; every loop is bounded in steps.

use zcfs_l2::endpoint::{CMD_REGION_LEN, CMD_RX_CHUNKS};
use zcfs_l2::frame::{build, encode, Body, Macs, TagKey};
use zcfs_l2::layout::fill_plan;
use zcfs_l2::sim::{Injector, SimEnd, SimLink};
use zcfs_l2::{
    Config, Endpoint, Event, Extent, SlotGeometry, BLOCK_SIZE, HEADER_LEN, MAX_FRAME_LEN, MIN_FRONT,
};
use zcfs_xsk::{FrameIo, TX_ADDR_ALIGN, UMEM_CHUNK_SIZE};

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
const DATA_LEN: usize = 4 << 20;
const SRC: u64 = 2 << 20;
const SCRATCH: u64 = 3 << 20;
const SCRATCH_CHUNKS: u32 = 256;
const RTO: u64 = 200_000;
const QUIET: u64 = 50_000;
const STEP: u64 = 10_000;
const TIMEOUT: u64 = 100_000_000;

type Ep = Endpoint<SimEnd, SimEnd>;

fn config(local: [u8; 6], peer: [u8; 6]) -> Config {
    Config {
        local_mac: local,
        peer_mac: peer,
        rto_ns: RTO,
        quiet_ns: QUIET,
        transfer_timeout_ns: TIMEOUT,
        credit_frames: 64,
        tx_scratch: (SCRATCH, SCRATCH_CHUNKS),
        open_tags: false,
    }
}

struct Net {
    a: Ep,
    b: Ep,
    a_data: SimEnd,
    b_data: SimEnd,
    a_cmd: SimEnd,
    now: u64,
}

fn net_with(ca: Config, cb: Config) -> Net {
    let (a_data, b_data) = SimLink::pair(DATA_LEN, DATA_LEN, Injector::none(1));
    let (a_cmd, b_cmd) = SimLink::pair(CMD_REGION_LEN, CMD_REGION_LEN, Injector::none(2));
    // Second handles on the same sockets, taken before any I/O (reopen clears empty rings).
    let a = Endpoint::new(ca, b"k", a_data.reopen(), a_cmd.reopen()).unwrap();
    let b = Endpoint::new(cb, b"k", b_data.reopen(), b_cmd).unwrap();
    Net {
        a,
        b,
        a_data,
        b_data,
        a_cmd,
        now: 0,
    }
}

fn net() -> Net {
    net_with(config(MAC_A, MAC_B), config(MAC_B, MAC_A))
}

impl Net {
    fn step(&mut self) -> (Vec<Event>, Vec<Event>) {
        self.now += STEP;
        (
            self.a.poll(self.now).unwrap(),
            self.b.poll(self.now).unwrap(),
        )
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 9) as u8)
        .collect()
}

fn slot(i: u64) -> Extent {
    Extent {
        offset: 8192 + i * 8 * BLOCK_SIZE as u64,
        blocks: 1,
    }
}

fn src(i: u64) -> Extent {
    Extent {
        offset: SRC + i * BLOCK_SIZE as u64,
        blocks: 1,
    }
}

/// The receiver chose two transfers; the sender only sends the second (it never sends the
/// first: the request failed on its side, or it crashed before `send`; the receiver has no
/// way to cancel an expected transfer). The second must still be committed, long before
/// the transfer timeout, and must not be aborted.
#[test]
fn a_transfer_the_sender_never_sends_does_not_starve_another() {
    let mut n = net();
    let data = pattern(7, BLOCK_SIZE);
    n.a_data.region().write(src(1).offset, &data).unwrap();
    let unsent = n.b.expect(&[slot(0)]).unwrap();
    let sent = n.b.expect(&[slot(1)]).unwrap();
    n.a.send(sent, &[src(1)]).unwrap();
    let mut committed = false;
    let mut aborted = Vec::new();
    // Run up to twice the transfer timeout (1000 RTOs) to see what happens instead; a
    // pass needs the commit within a tenth of the timeout (checked below).
    let max_steps = 2 * TIMEOUT / STEP;
    for _ in 0..max_steps {
        let (_, eb) = n.step();
        for e in eb {
            match e {
                Event::Committed(x) if x == sent => committed = true,
                Event::Aborted(x) => aborted.push(x),
                _ => {}
            }
        }
        if committed {
            break;
        }
    }
    assert!(
        committed,
        "transfer {sent} was never committed (aborted: {aborted:?}, unsent one is {unsent}) \
         after {} ms simulated; b {:?}",
        n.now / 1_000_000,
        n.b.stats()
    );
    assert!(
        !aborted.contains(&sent),
        "the sent transfer was aborted: {aborted:?}"
    );
    assert!(
        n.now < TIMEOUT / 10,
        "committed only after {} ns (timeout {TIMEOUT})",
        n.now
    );
}

/// A neighbour's forged data frame shifts a group and starts a drain. With a quiet time
/// longer than the RTO (nothing in `Endpoint::new` refuses that), the drain must still
/// end and the transfer commit (or the configuration must be refused up front).
#[test]
fn a_drain_ends_when_the_quiet_time_is_longer_than_the_rto() {
    let mut ca = config(MAC_A, MAC_B);
    let mut cb = config(MAC_B, MAC_A);
    ca.quiet_ns = 2 * RTO;
    cb.quiet_ns = 2 * RTO;
    let (a_data, b_data) = SimLink::pair(DATA_LEN, DATA_LEN, Injector::none(1));
    let (a_cmd, b_cmd) = SimLink::pair(CMD_REGION_LEN, CMD_REGION_LEN, Injector::none(2));
    let a = Endpoint::new(ca, b"k", a_data.reopen(), a_cmd.reopen());
    let b = Endpoint::new(cb, b"k", b_data.reopen(), b_cmd);
    let (Ok(a), Ok(b)) = (a, b) else {
        return; // Refusing the configuration is an acceptable answer.
    };
    let mut n = Net {
        a,
        b,
        a_data,
        b_data,
        a_cmd,
        now: 0,
    };
    let data = pattern(3, BLOCK_SIZE);
    n.a_data.region().write(src(0).offset, &data).unwrap();
    let id = n.b.expect(&[slot(0)]).unwrap();
    n.step(); // B posts and grants.
              // A neighbour's frame (no key) takes the first posted entry.
    let mut h = [0u8; HEADER_LEN];
    encode(
        &mut h,
        Macs {
            dst: MAC_B,
            src: MAC_A,
        },
        &Body::Nop {
            epoch: 0,
            group: 0,
            transfer: 0,
        },
        &[],
        &TagKey::derive(b"neighbour"),
    );
    let mut f = h.to_vec();
    f.resize(MAX_FRAME_LEN, 0);
    n.a_data.inject(&f);
    n.a.send(id, &[src(0)]).unwrap();
    let mut committed = false;
    for _ in 0..(TIMEOUT / 2 / STEP) {
        let (_, eb) = n.step();
        if eb.contains(&Event::Committed(id)) {
            committed = true;
            break;
        }
    }
    assert!(
        committed,
        "not committed after {} ms simulated: b {:?}",
        n.now / 1_000_000,
        n.b.stats()
    );
    let mut got = vec![0u8; BLOCK_SIZE];
    n.b_data.region().read(slot(0).offset, &mut got).unwrap();
    assert_eq!(got, data);
}

/// The kernel (xp_check_unaligned) takes a fill address `a` only if
/// `a + UMEM_CHUNK_SIZE <= UMEM length`; an entry that fails is consumed and skipped
/// (counted as an invalid descriptor), so every later frame lands one entry early and
/// the receiver's count of posted entries never reaches zero. Every extent the protocol
/// accepts must therefore have fill addresses that satisfy the rule.
#[test]
fn every_fill_address_of_an_accepted_extent_satisfies_the_kernels_chunk_rule() {
    let size = DATA_LEN;
    let chunk = UMEM_CHUNK_SIZE as u64;
    let mut bad = Vec::new();
    // Extents ending at the region's end, of every size.
    for blocks in 1..=zcfs_l2::MAX_EXTENT_BLOCKS {
        let ext = Extent {
            offset: size as u64 - blocks as u64 * BLOCK_SIZE as u64,
            blocks,
        };
        if ext.check_receivable(size).is_ok() {
            let worst = fill_plan(&ext).iter().map(|p| p.fill).max().unwrap();
            if worst + chunk > size as u64 {
                bad.push((blocks, worst));
            }
        }
    }
    // A slot geometry whose last slot ends at the region's end is accepted too.
    let g = SlotGeometry::packed(MIN_FRONT, 1, 4);
    let last = g.slot(3).unwrap();
    let geo_size = (last.offset + last.bytes()) as usize;
    let geo_ok = g.check(geo_size).is_ok();
    let geo_worst = fill_plan(&last).iter().map(|p| p.fill).max().unwrap();
    // And the endpoint posts such an extent.
    let mut n = net();
    let end = Extent {
        offset: DATA_LEN as u64 - BLOCK_SIZE as u64,
        blocks: 1,
    };
    let expect_ok = n.b.expect(&[end]).is_ok();
    assert!(
        bad.is_empty() && !(geo_ok && geo_worst + chunk > geo_size as u64) && !expect_ok,
        "accepted extents whose fill address + {chunk} passes the region end ({size}): \
         {} of 32 sizes, e.g. {:?}; slot geometry accepted: {geo_ok} (fill {geo_worst} + \
         {chunk} > {geo_size}); expect() accepted the last block of the region: {expect_ok}",
        bad.len(),
        bad.first()
    );
}

/// A frame longer than MAX_FRAME_LEN that lands in one of our command chunks (a
/// neighbour's frame on an interface whose MTU is above 1500: the kernel takes frames up
/// to the chunk size less the headroom) is refused, but its chunk must go back to the
/// fill ring; else CMD_RX_CHUNKS such frames leave the command queue without a receive
/// buffer for good, and no command or control record arrives again.
#[test]
fn oversized_frames_on_the_command_queue_do_not_use_up_its_receive_chunks() {
    let mut n = net();
    let junk = vec![0xEEu8; MAX_FRAME_LEN + 1];
    for _ in 0..CMD_RX_CHUNKS {
        n.a_cmd.inject(&junk);
        n.step();
    }
    n.a.send_command(b"still there?").unwrap();
    let mut got = None;
    for _ in 0..(100 * RTO / STEP) {
        let (_, eb) = n.step();
        if let Some(Event::Command(c)) = eb.into_iter().next() {
            got = Some(c);
            break;
        }
    }
    assert_eq!(
        got.as_deref(),
        Some(&b"still there?"[..]),
        "b {:?}",
        n.b.stats()
    );
}

/// AF_XDP TX addresses must be multiples of TX_ADDR_ALIGN (an odd address comes back
/// from the completion ring with bit 0 cleared, so the sender's chunk pool would hold an
/// address one byte off and frames would overlap). The endpoint must refuse a TX
/// scratch area whose chunks are not aligned.
#[test]
fn an_unaligned_tx_scratch_is_refused() {
    let (d, _) = SimLink::pair(DATA_LEN, DATA_LEN, Injector::none(1));
    let (c, _) = SimLink::pair(CMD_REGION_LEN, CMD_REGION_LEN, Injector::none(1));
    let cfg = Config {
        tx_scratch: (SCRATCH + 1, SCRATCH_CHUNKS),
        open_tags: false,
        ..config(MAC_A, MAC_B)
    };
    assert_eq!(SCRATCH % TX_ADDR_ALIGN, 0);
    assert!(
        Endpoint::new(cfg, b"k", d, c).is_err(),
        "a TX scratch at an odd offset was accepted"
    );
}

/// What holds (and a check of the harness): a clean transfer commits once with every byte
/// in place and is delivered; a command frame tagged with an earlier session's key is
/// refused.
#[test]
fn a_clean_transfer_commits_once_through_the_review_harness() {
    let mut n = net();
    let data = pattern(1, BLOCK_SIZE);
    n.a_data.region().write(src(0).offset, &data).unwrap();
    let id = n.b.expect(&[slot(0)]).unwrap();
    n.a.send(id, &[src(0)]).unwrap();
    let mut commits = 0;
    let mut delivered = false;
    for _ in 0..1000 {
        let (ea, eb) = n.step();
        commits += eb.iter().filter(|e| **e == Event::Committed(id)).count();
        delivered |= ea.contains(&Event::Delivered(id));
    }
    assert_eq!(commits, 1);
    assert!(delivered);
    let mut got = vec![0u8; BLOCK_SIZE];
    n.b_data.region().read(slot(0).offset, &mut got).unwrap();
    assert_eq!(got, data);
    // A replay of a (keyed) command frame from an earlier session is refused.
    let old = build(
        Macs {
            dst: MAC_B,
            src: MAC_A,
        },
        &Body::Command {
            seq: 0,
            ack: 0,
            len: 3,
        },
        b"old",
        &TagKey::derive(b"an earlier session"),
    );
    let before = n.b.stats().refused;
    n.a_cmd.inject(&old);
    let (_, eb) = n.step();
    assert!(eb.is_empty(), "{eb:?}");
    assert_eq!(n.b.stats().refused, before + 1);
}

// ---- added with the fixes (l2fix) ----

/// Run until `done` says so, at most `max` steps; returns every event of B and A.
fn run_until(
    n: &mut Net,
    max: u64,
    mut done: impl FnMut(&[Event], &[Event]) -> bool,
) -> (Vec<Event>, Vec<Event>) {
    let (mut all_a, mut all_b) = (Vec::new(), Vec::new());
    for _ in 0..max {
        let (ea, eb) = n.step();
        all_a.extend(ea);
        all_b.extend(eb);
        if done(&all_a, &all_b) {
            break;
        }
    }
    (all_a, all_b)
}

/// The read fast path: the receiver posts and grants before the sender has the
/// transfer (the request is still being executed); a send within the hold time goes
/// out with no skip, no drain and no extra round trip.
#[test]
fn a_transfer_sent_shortly_after_its_grant_is_not_skipped() {
    let mut n = net();
    let data = pattern(5, BLOCK_SIZE);
    n.a_data.region().write(src(0).offset, &data).unwrap();
    let id = n.b.expect(&[slot(0)]).unwrap();
    // Grants are in; A waits just under the hold time before it has the transfer.
    let hold = RTO / zcfs_l2::endpoint::SKIP_HOLD_RTO_DIVISOR;
    for _ in 0..(hold / STEP - 2) {
        n.step();
    }
    assert_eq!(n.a.stats().groups_skipped, 0);
    n.a.send(id, &[src(0)]).unwrap();
    let (_, eb) = run_until(&mut n, 100, |_, b| b.contains(&Event::Committed(id)));
    assert!(eb.contains(&Event::Committed(id)), "b {:?}", n.b.stats());
    assert_eq!(n.a.stats().groups_skipped, 0);
    assert_eq!(n.b.stats().drains, 0);
}

/// A transfer the sender gets only after it skipped the transfer's group is posted
/// again when the sender says READY, and committed; the one behind it was not held up.
#[test]
fn a_skipped_transfer_is_posted_again_once_the_sender_has_it() {
    let mut n = net();
    let late = pattern(6, BLOCK_SIZE);
    let other = pattern(8, BLOCK_SIZE);
    n.a_data.region().write(src(0).offset, &late).unwrap();
    n.a_data.region().write(src(1).offset, &other).unwrap();
    let first = n.b.expect(&[slot(0)]).unwrap();
    let second = n.b.expect(&[slot(1)]).unwrap();
    n.a.send(second, &[src(1)]).unwrap();
    let (_, eb) = run_until(&mut n, 1000, |_, b| b.contains(&Event::Committed(second)));
    assert!(
        eb.contains(&Event::Committed(second)),
        "b {:?}",
        n.b.stats()
    );
    assert_eq!(n.a.stats().groups_skipped, 1);
    assert_eq!(n.b.stats().skips_received, 1);
    assert_eq!(n.b.stats().drains, 0, "a skip keeps the groups in step");
    n.a.send(first, &[src(0)]).unwrap();
    let (_, eb) = run_until(&mut n, 1000, |_, b| b.contains(&Event::Committed(first)));
    assert!(eb.contains(&Event::Committed(first)), "b {:?}", n.b.stats());
    let mut got = vec![0u8; BLOCK_SIZE];
    n.b_data.region().read(slot(0).offset, &mut got).unwrap();
    assert_eq!(got, late);
    n.b_data.region().read(slot(1).offset, &mut got).unwrap();
    assert_eq!(got, other);
}

/// The receiver cancels a posted transfer the sender will never send (the read failed on
/// the server): the sender fills its groups at once, the slots come back, and the
/// transfer posted after it commits, without a drain.
#[test]
fn a_cancelled_transfer_frees_its_slots_and_holds_nothing_up() {
    let mut n = net();
    let data = pattern(9, BLOCK_SIZE);
    n.a_data.region().write(src(1).offset, &data).unwrap();
    let failed = n.b.expect(&[slot(0)]).unwrap();
    let next = n.b.expect(&[slot(1)]).unwrap();
    n.step(); // Both posted and granted.
    assert!(n.b.cancel(failed));
    assert!(!n.b.cancel(failed), "cancelled once");
    n.a.send(next, &[src(1)]).unwrap();
    let (_, eb) = run_until(&mut n, 1000, |_, b| {
        b.contains(&Event::Committed(next)) && b.contains(&Event::SlotsFree(failed))
    });
    assert!(eb.contains(&Event::Committed(next)), "b {:?}", n.b.stats());
    assert!(
        eb.contains(&Event::SlotsFree(failed)),
        "b {:?}",
        n.b.stats()
    );
    assert!(!eb.contains(&Event::Aborted(failed)));
    assert_eq!(n.b.stats().drains, 0);
    assert!(
        n.now < RTO / zcfs_l2::endpoint::SKIP_HOLD_RTO_DIVISOR,
        "the sender skipped without waiting the hold time ({} ns)",
        n.now
    );
    assert_eq!(n.b_data.posted(), 0);
}
