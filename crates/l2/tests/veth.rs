//! The layer-2 protocol on real AF_XDP sockets over a veth pair between two namespaces
//! (root; see common::l2_ready): blocks landing in place in a /dev/shm file region,
//! through a lossy link, reads, commands and a sender restart. Every loop is bounded in
//! count and in time; the figures printed are for the record, not asserted.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{l2_ready, pattern, peer, shm_file, Link, Peer, SecondMapping, Timing, TIMING};
use zcfs_l2::endpoint::{CMD_CHUNK, CMD_REGION_LEN};
use zcfs_l2::frame::{build, Body, Macs, TagKey};
use zcfs_l2::{Event, Extent, L2Error, BLOCK_SIZE, HEADER_LEN, MAX_COMMAND, MAX_EXTENT_BLOCKS};
use zcfs_xsk::Region;

const BLOCK: u64 = BLOCK_SIZE as u64;
/// The server's volume file: block 0 is never a target (an extent needs MIN_FRONT bytes
/// in front of it), blocks 1.. take writes; read sources lie behind the write area.
const VOL_BLOCKS: u64 = 4096;
const READ_SRC: u64 = VOL_BLOCKS * BLOCK;
/// Transfers in flight at once, each at most this many extents.
const QD: usize = 8;
const XFER_EXTENTS: usize = 4;
const SLOT: u64 = XFER_EXTENTS as u64 * MAX_EXTENT_BLOCKS as u64 * BLOCK;
const VOL_LEN: u64 = READ_SRC + QD as u64 * SLOT;
/// The client's region: write sources, then the receive buffer for reads, then scratch.
const CLI_SRC: u64 = 0;
const CLI_RX: u64 = QD as u64 * SLOT;
const CLI_RX_BLOCKS: u64 = 2048;
const CLI_LEN: u64 = CLI_RX + CLI_RX_BLOCKS * BLOCK;
/// Polls of one test at most (with the time bound, whichever first).
const MAX_POLLS: u64 = 2_000_000_000;
/// After issuing stops, in-flight transfers must end within this.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

struct Net {
    // Endpoints before the link: sockets close before the programs and namespaces go.
    srv: Peer,
    /// None only while the client process restarts.
    cli: Option<Peer>,
    vol_file: std::fs::File,
    vol: Arc<Region>,
    cli_region: Arc<Region>,
    link: Link,
    t0: Instant,
}

fn volume_content() -> Vec<u8> {
    let mut v = vec![0u8; VOL_LEN as usize];
    pattern(0xC0FFEE, &mut v);
    v
}

fn net(label: &str, ppm: u32, seed: u64, srv_timing: Timing) -> Net {
    let mut link = Link::new(label);
    let vol_file = shm_file(label, &volume_content());
    let vol = Arc::new(Region::map_file(&vol_file, common::STAGING).unwrap());
    assert_eq!(vol.file_len() as u64, VOL_LEN);
    let cli_region = Arc::new(Region::anonymous(CLI_LEN as usize + common::STAGING).unwrap());
    let srv = peer(
        &mut link,
        true,
        vol.clone(),
        VOL_LEN,
        b"session",
        seed,
        ppm,
        srv_timing,
        false,
    );
    let cli = peer(
        &mut link,
        false,
        cli_region.clone(),
        CLI_LEN,
        b"session",
        seed.wrapping_add(1),
        ppm,
        TIMING,
        false,
    );
    Net {
        srv,
        cli: Some(cli),
        vol_file,
        vol,
        cli_region,
        link,
        t0: Instant::now(),
    }
}

impl Net {
    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// Poll both ends once: (server's events, client's events).
    fn step(&mut self) -> (Vec<Event>, Vec<Event>) {
        let now = self.now();
        let es = self.srv.ep.poll(now).unwrap();
        let ec = self.cli.as_mut().unwrap().ep.poll(now).unwrap();
        (es, ec)
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Xfer {
    dst: Vec<Extent>,
    data: Vec<Vec<u8>>,
    slot: usize,
    blocks: u64,
}

struct Outcome {
    transfers: u64,
    blocks: u64,
    elapsed: Duration,
}

/// Transfers of 1..=XFER_EXTENTS extents of 1..=`max_blocks` blocks at random places of
/// the receiver's area, QD at once, client→server (`write`) or server→client, until
/// `target_blocks` or `issue_for` passed. Every byte is checked at commit, each transfer
/// is committed and delivered exactly once, and at the end every byte of the receiver's
/// area outside the extents is what it was, except the clobbered HEADER_LEN bytes in
/// front of an extent (unless a later extent rewrote them).
fn transfers(
    n: &mut Net,
    write: bool,
    max_blocks: u32,
    target_blocks: u64,
    issue_for: Duration,
    seed: u64,
) -> Outcome {
    let second = SecondMapping::new(&n.vol_file, VOL_LEN as usize);
    // The receiver's area [lo, hi) and its model.
    let (lo, hi) = if write {
        (BLOCK, VOL_BLOCKS * BLOCK)
    } else {
        (CLI_RX + BLOCK, CLI_RX + CLI_RX_BLOCKS * BLOCK)
    };
    let read_rx = |n: &Net, off: u64, buf: &mut [u8]| {
        if write {
            second.read(off as usize, buf);
        } else {
            n.cli_region.read(off, buf).unwrap();
        }
    };
    // The model covers a block in front of the area too (the first extent's front).
    let base = lo - BLOCK;
    let mut model = vec![0u8; (hi - base) as usize];
    read_rx(n, base, &mut model);
    let mut unknown = vec![false; model.len()];
    let mut rng = Rng(seed | 1);
    let mut inflight: HashMap<u32, Xfer> = HashMap::new();
    let mut free_slots: Vec<usize> = (0..QD).collect();
    let mut committed: HashSet<u32> = HashSet::new();
    let mut delivered: HashSet<u32> = HashSet::new();
    let (mut issued_blocks, mut done_blocks, mut done) = (0u64, 0u64, 0u64);
    let mut got = Vec::new();
    let t = Instant::now();
    let mut issuing = true;
    let mut stopped_at = None;
    for poll in 0.. {
        assert!(poll < MAX_POLLS, "{MAX_POLLS} polls");
        if issuing && (issued_blocks >= target_blocks || t.elapsed() >= issue_for) {
            issuing = false;
            stopped_at = Some(Instant::now());
        }
        if let Some(s) = stopped_at {
            if inflight.is_empty() {
                break;
            }
            assert!(
                s.elapsed() < DRAIN_LIMIT,
                "{} transfers still in flight {DRAIN_LIMIT:?} after issuing stopped; server {:?} client {:?}",
                inflight.len(),
                n.srv.ep.stats(),
                n.cli.as_mut().unwrap().ep.stats()
            );
        }
        while issuing && !free_slots.is_empty() {
            let slot = free_slots.pop().unwrap();
            let k = 1 + rng.below(XFER_EXTENTS as u64) as usize;
            let mut dst: Vec<Extent> = Vec::new();
            let busy: Vec<Extent> = inflight.values().flat_map(|x| x.dst.clone()).collect();
            for _ in 0..k {
                let blocks = 1 + rng.below(max_blocks as u64) as u32;
                for _try in 0..32 {
                    let span = (hi - lo) / BLOCK - blocks as u64;
                    let e = Extent {
                        offset: lo + rng.below(span + 1) * BLOCK,
                        blocks,
                    };
                    if !busy
                        .iter()
                        .chain(&dst)
                        .any(|o| zcfs_l2::layout::overlaps(o, &e))
                    {
                        dst.push(e);
                        break;
                    }
                }
            }
            if dst.is_empty() {
                free_slots.push(slot);
                break;
            }
            let src_base = if write { CLI_SRC } else { READ_SRC } + slot as u64 * SLOT;
            let mut src = Vec::new();
            let mut data = Vec::new();
            let mut at = src_base;
            let seed = rng.next();
            for (i, e) in dst.iter().enumerate() {
                let mut d = vec![0u8; e.bytes() as usize];
                pattern(seed.wrapping_add(i as u64), &mut d);
                let s = Extent {
                    offset: at,
                    blocks: e.blocks,
                };
                at += e.bytes();
                if write {
                    n.cli_region.write(s.offset, &d).unwrap();
                } else {
                    n.vol.write(s.offset, &d).unwrap();
                }
                src.push(s);
                data.push(d);
            }
            let blocks: u64 = dst.iter().map(|e| e.blocks as u64).sum();
            let (rx, tx) = if write {
                (&mut n.srv.ep, &mut n.cli.as_mut().unwrap().ep)
            } else {
                (&mut n.cli.as_mut().unwrap().ep, &mut n.srv.ep)
            };
            let id = rx.expect(&dst).unwrap();
            tx.send(id, &src).unwrap();
            issued_blocks += blocks;
            inflight.insert(
                id,
                Xfer {
                    dst,
                    data,
                    slot,
                    blocks,
                },
            );
        }
        let (es, ec) = n.step();
        let (rx_ev, tx_ev) = if write { (es, ec) } else { (ec, es) };
        for e in rx_ev {
            match e {
                Event::Committed(id) => {
                    assert!(committed.insert(id), "transfer {id} committed twice");
                    let x = inflight.get(&id).expect("committed an unknown transfer");
                    for (e, d) in x.dst.iter().zip(&x.data) {
                        got.resize(d.len(), 0);
                        read_rx(n, e.offset, &mut got);
                        if got != *d {
                            let at = got.iter().zip(d).position(|(a, b)| a != b).unwrap();
                            panic!("transfer {id}: extent at {} differs at byte {at}", e.offset);
                        }
                        let m = (e.offset - base) as usize;
                        model[m..m + d.len()].copy_from_slice(d);
                        unknown[m..m + d.len()].iter_mut().for_each(|u| *u = false);
                        unknown[m - HEADER_LEN..m]
                            .iter_mut()
                            .for_each(|u| *u = true);
                    }
                }
                other => panic!(
                    "receiver: unexpected {other:?}\n--- server ---\n{}--- client ---\n{}",
                    n.srv.ep.debug_state(),
                    n.cli.as_ref().unwrap().ep.debug_state()
                ),
            }
        }
        for e in tx_ev {
            match e {
                Event::Delivered(id) => {
                    assert!(delivered.insert(id), "transfer {id} delivered twice");
                }
                other => panic!(
                    "sender: unexpected {other:?}\n--- server ---\n{}--- client ---\n{}",
                    n.srv.ep.debug_state(),
                    n.cli.as_ref().unwrap().ep.debug_state()
                ),
            }
        }
        let ended: Vec<u32> = inflight
            .keys()
            .copied()
            .filter(|id| committed.contains(id) && delivered.contains(id))
            .collect();
        for id in ended {
            let x = inflight.remove(&id).unwrap();
            free_slots.push(x.slot);
            done_blocks += x.blocks;
            done += 1;
        }
    }
    let elapsed = t.elapsed();
    // Nothing outside the extents (and their clobbered fronts) changed.
    let mut all = vec![0u8; model.len()];
    read_rx(n, base, &mut all);
    let stray = (0..all.len()).find(|&i| !unknown[i] && all[i] != model[i]);
    assert_eq!(
        stray.map(|i| base + i as u64),
        None,
        "a byte outside the extents changed"
    );
    Outcome {
        transfers: done,
        blocks: done_blocks,
        elapsed,
    }
}

fn report(what: &str, o: &Outcome, n: &Net) {
    eprintln!(
        "{what}: {} transfers, {} blocks in {:.2?} ({:.1} MB/s); server {:?}; client {:?}; \
         server faults data {:?} cmd {:?}; client faults data {:?} cmd {:?}",
        o.transfers,
        o.blocks,
        o.elapsed,
        o.blocks as f64 * BLOCK as f64 / o.elapsed.as_secs_f64() / 1e6,
        n.srv.ep.stats(),
        n.cli.as_ref().unwrap().ep.stats(),
        n.srv.data.counters(),
        n.srv.cmd.counters(),
        n.cli.as_ref().unwrap().data.counters(),
        n.cli.as_ref().unwrap().cmd.counters(),
    );
}

#[test]
fn blocks_land_in_place_in_a_file_over_veth() {
    if !l2_ready() {
        return;
    }
    let mut n = net("l2-inplace", 0, 1, TIMING);
    let o = transfers(
        &mut n,
        true,
        MAX_EXTENT_BLOCKS,
        1_000_000,
        Duration::from_secs(60),
        11,
    );
    report("clean writes", &o, &n);
    assert!(o.transfers > 0);
    assert_eq!(n.srv.ep.stats().aborted, 0);
}

#[test]
fn blocks_land_in_place_through_one_percent_loss_duplication_and_reordering() {
    if !l2_ready() {
        return;
    }
    // 1 % each of loss, duplication and reordering of every frame sent, both ends, data
    // and command queues. A failed extent is retransmitted whole, so a 32-block extent
    // (90 frames) passes whole a few percent of the time: fewer blocks than the clean
    // run, bounded by the same time.
    let mut n = net("l2-lossy", 10_000, 2, TIMING);
    let o = transfers(
        &mut n,
        true,
        MAX_EXTENT_BLOCKS,
        20_000,
        Duration::from_secs(60),
        12,
    );
    report("lossy writes", &o, &n);
    assert!(o.transfers > 0);
    let faults = n.cli.as_mut().unwrap().data.counters();
    assert!(faults.lost > 0 && faults.duplicated > 0 && faults.reordered > 0);
    let faults = n.srv.cmd.counters();
    assert!(faults.lost > 0 && faults.duplicated > 0 && faults.reordered > 0);
    assert!(
        n.srv.ep.stats().groups_failed > 0,
        "the faults were noticed"
    );
}

#[test]
fn reads_land_in_the_clients_receive_buffer_over_veth() {
    if !l2_ready() {
        return;
    }
    let mut n = net("l2-read", 0, 3, TIMING);
    let o = transfers(
        &mut n,
        false,
        MAX_EXTENT_BLOCKS,
        100_000,
        Duration::from_secs(30),
        13,
    );
    report("clean reads", &o, &n);
    assert!(o.transfers > 0);
}

/// Run both ends until `until` says stop or `limit` passed; returns whether it stopped.
fn run_until(
    n: &mut Net,
    limit: Duration,
    mut until: impl FnMut(&mut Net, Vec<Event>, Vec<Event>) -> bool,
) -> bool {
    let t = Instant::now();
    for _ in 0..MAX_POLLS {
        if t.elapsed() >= limit {
            return false;
        }
        let (es, ec) = n.step();
        if until(n, es, ec) {
            return true;
        }
    }
    false
}

#[test]
fn commands_round_trip_over_veth_up_to_max_command() {
    if !l2_ready() {
        return;
    }
    let mut n = net("l2-cmd", 0, 4, TIMING);
    assert!(matches!(
        n.cli
            .as_mut()
            .unwrap()
            .ep
            .send_command(&vec![0u8; MAX_COMMAND + 1]),
        Err(L2Error::CommandSize(_))
    ));
    assert!(matches!(
        n.cli.as_mut().unwrap().ep.send_command(&[]),
        Err(L2Error::CommandSize(0))
    ));
    let sizes = [1, 2, 100, 1000, MAX_COMMAND - 1, MAX_COMMAND];
    for round in 0..300u64 {
        let size = sizes[round as usize % sizes.len()];
        let mut req = vec![0u8; size];
        pattern(round, &mut req);
        n.cli.as_mut().unwrap().ep.send_command(&req).unwrap();
        let mut reply: Option<Vec<u8>> = None;
        let ok = run_until(&mut n, Duration::from_secs(10), |n, es, ec| {
            for e in es {
                match e {
                    Event::Command(c) => {
                        assert_eq!(c, req, "round {round}: request");
                        // The reply: the request reversed, at the largest size too.
                        let mut r = c.clone();
                        r.reverse();
                        n.srv.ep.send_command(&r).unwrap();
                    }
                    other => panic!("server: {other:?}"),
                }
            }
            for e in ec {
                match e {
                    Event::Command(c) => reply = Some(c),
                    other => panic!("client: {other:?}"),
                }
            }
            reply.is_some()
        });
        assert!(ok, "round {round}: no reply");
        let mut want = req.clone();
        want.reverse();
        assert_eq!(reply.unwrap(), want, "round {round}: reply");
    }
    let (s, c) = (n.srv.ep.stats(), n.cli.as_mut().unwrap().ep.stats());
    assert_eq!((s.commands_received, c.commands_received), (300, 300));
    assert_eq!(s.refused + c.refused, 0);
}

#[test]
fn a_restarted_sender_never_commits_its_old_transfer_and_forged_frames_are_refused() {
    if !l2_ready() {
        return;
    }
    let timing = Timing {
        transfer_timeout_ns: 300_000_000,
        ..TIMING
    };
    let mut n = net("l2-restart", 0, 5, timing);
    // One transfer of 64 extents of 32 blocks (8 MiB): many credit windows, so the
    // sender dies in the middle.
    let dst: Vec<Extent> = (0..zcfs_l2::MAX_TRANSFER_EXTENTS as u64)
        .map(|i| Extent {
            offset: BLOCK + i * (MAX_EXTENT_BLOCKS as u64 + 1) * BLOCK,
            blocks: MAX_EXTENT_BLOCKS,
        })
        .collect();
    let src: Vec<Extent> = (0..dst.len() as u64)
        .map(|i| Extent {
            offset: i * MAX_EXTENT_BLOCKS as u64 * BLOCK,
            blocks: MAX_EXTENT_BLOCKS,
        })
        .collect();
    assert!(src.last().unwrap().offset + src[0].bytes() <= CLI_LEN);
    let mut old_data = vec![0u8; src.len() * src[0].bytes() as usize];
    pattern(77, &mut old_data);
    n.cli_region.write(0, &old_data).unwrap();
    let old = n.srv.ep.expect(&dst).unwrap();
    n.cli.as_mut().unwrap().ep.send(old, &src).unwrap();
    let mid = run_until(&mut n, Duration::from_secs(30), |n, es, _| {
        assert!(
            !es.contains(&Event::Committed(old)),
            "sent whole before the restart"
        );
        n.srv.ep.stats().extents_verified >= 2
    });
    assert!(mid, "no extent arrived: {:?}", n.srv.ep.stats());
    // The sender's process dies: nothing more leaves it, nothing answers.
    n.cli.as_mut().unwrap().data.set_rates(1_000_000, 0, 0);
    n.cli.as_mut().unwrap().cmd.set_rates(1_000_000, 0, 0);
    let aborted = run_until(&mut n, Duration::from_secs(10), |_, es, _| {
        for e in &es {
            assert!(
                !matches!(e, Event::Committed(_)),
                "committed a transfer whose sender died"
            );
        }
        es.contains(&Event::Aborted(old))
    });
    assert!(aborted, "the receiver never timed the old transfer out");
    // A new process: new sockets on the same queues, a new session key; the server
    // learns it (over TCP in the transport) and rekeys.
    n.cli = None;
    let fresh = peer(
        &mut n.link,
        false,
        n.cli_region.clone(),
        CLI_LEN,
        b"new session",
        6,
        0,
        TIMING,
        false,
    );
    n.cli = Some(fresh);
    n.srv.ep.rekey(b"new session");
    let freed = run_until(&mut n, Duration::from_secs(10), |_, es, _| {
        for e in &es {
            assert!(
                !matches!(e, Event::Committed(_)),
                "committed in the new session"
            );
        }
        es.contains(&Event::SlotsFree(old))
    });
    assert!(
        freed,
        "the old transfer's slots were never freed: {:?}",
        n.srv.ep.stats()
    );
    // A neighbour on the segment: a command with the old session's tag and one with a
    // guessed key, sent from the client's command socket (memory the endpoint leaves).
    let refused0 = n.srv.ep.stats().refused;
    let macs = Macs {
        dst: n.link.srv.mac,
        src: n.link.cli.mac,
    };
    for (i, key) in [&b"session"[..], b"a guess"].iter().enumerate() {
        let f = build(
            macs,
            &Body::Command {
                seq: 0,
                ack: 0,
                len: 4,
            },
            b"evil",
            &TagKey::derive(key),
        );
        n.cli
            .as_mut()
            .unwrap()
            .cmd
            .inject(CMD_REGION_LEN as u64 + i as u64 * CMD_CHUNK, &f);
    }
    let refused = run_until(&mut n, Duration::from_secs(10), |n, es, _| {
        for e in &es {
            assert!(
                !matches!(e, Event::Command(_)),
                "a forged command was delivered"
            );
        }
        n.srv.ep.stats().refused >= refused0 + 2
    });
    assert!(refused, "forged frames not counted: {:?}", n.srv.ep.stats());
    assert_eq!(n.cli.as_mut().unwrap().cmd.counters().injected, 2);
    // The same slots take the new session's transfer with other data, committed once.
    let mut new_data = vec![0u8; old_data.len()];
    pattern(78, &mut new_data);
    n.cli_region.write(0, &new_data).unwrap();
    let id = n.srv.ep.expect(&dst).unwrap();
    n.cli.as_mut().unwrap().ep.send(id, &src).unwrap();
    let mut commits = 0;
    let mut delivered = false;
    let ok = run_until(&mut n, Duration::from_secs(60), |_, es, ec| {
        for e in es {
            match e {
                Event::Committed(x) => {
                    assert_eq!(x, id, "only the new transfer commits");
                    commits += 1;
                }
                other => panic!("server: {other:?}"),
            }
        }
        delivered |= ec.contains(&Event::Delivered(id));
        commits == 1 && delivered
    });
    assert!(
        ok,
        "the new transfer did not complete: {:?}",
        n.srv.ep.stats()
    );
    let second = SecondMapping::new(&n.vol_file, VOL_LEN as usize);
    for (i, e) in dst.iter().enumerate() {
        let mut got = vec![0u8; e.bytes() as usize];
        second.read(e.offset as usize, &mut got);
        let at = i * e.bytes() as usize;
        assert!(got == new_data[at..at + got.len()], "extent {i}");
    }
    assert_eq!(n.srv.ep.stats().committed, 1);
}
