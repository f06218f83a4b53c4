//! RZCFS's layout over AF_XDP on veth: 4 KiB blocks sent as three frames, last segment
//! first, land contiguous in a /dev/shm file region (root; see common::l2_ready).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{header, l2_ready, shm_file, Link, SecondMapping};
use zcfs_xsk::{Desc, FrameIo, Region, ETHERTYPE_DATA, XDP_PACKET_HEADROOM};

/// Blocks sent.
const BLOCKS: u64 = 100_000;
/// Block size and its three segments' payloads (16-byte header each).
const BLOCK: usize = 4096;
const SEG: [usize; 3] = [1496, 1496, 1104];
const HDR: usize = 16;
/// Receive slots, 8 KiB apart so the 16 bytes in front of each block fall in a gap.
const SLOTS: u64 = 1024;
const STRIDE: u64 = 8192;
/// The first slot's block offset (>= 272 bytes of region before it).
const FIRST: u64 = 4096;
/// Blocks in flight at most: every one has a posted slot.
const WINDOW: u64 = SLOTS;
/// TX buffers in the sender's staging area, 2 KiB each.
const TX_BUFS: u64 = 2048;
const TX_BUF: u64 = 2048;
/// The run's bound (not a timing assertion: a hang or a lost frame ends here).
const LIMIT: Duration = Duration::from_secs(300);
const CANARY: u8 = 0xCC;

fn slot(n: u64) -> u64 {
    FIRST + (n % SLOTS) * STRIDE
}

/// Segment `seg`'s offset within the block.
fn seg_off(seg: usize) -> usize {
    SEG[..seg].iter().sum()
}

/// Fill addresses for a block at `b`, in arrival order (segment 2, 1, 0).
fn fills(b: u64) -> [u64; 3] {
    let r = HDR as u64 + XDP_PACKET_HEADROOM;
    [2992 + b - r, 1496 + b - r, b - r]
}

fn pattern(n: u64, out: &mut [u8]) {
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

fn field(n: u64, seg: usize) -> u16 {
    (((n & 0x3FFF) << 2) as u16) | seg as u16
}

#[test]
fn reverse_order_blocks_land_contiguous_in_a_file_region() {
    if !l2_ready() {
        return;
    }
    let mut link = Link::new("xsk-blocks");
    let rx_len = (FIRST + SLOTS * STRIDE + 4096) as usize;
    let rx_file = shm_file("rx", rx_len, CANARY);
    let rx_region = Arc::new(Region::map_file(&rx_file, 0).unwrap());
    assert_eq!(rx_region.file_len(), rx_len);
    let second = SecondMapping::new(&rx_file, rx_len);
    // The sender's frames are built in the staging area behind a small file.
    let tx_file = shm_file("tx", 4096, 0);
    let tx_region = Arc::new(Region::map_file(&tx_file, (TX_BUFS * TX_BUF) as usize).unwrap());
    let staging = tx_region.file_len() as u64;
    assert_eq!(staging, 4096);
    let mut rx = link.srv_socket(rx_region.clone(), 0);
    let mut tx = link.cli_socket(tx_region.clone(), 0);
    let (dst, src) = (link.srv.mac, link.cli.mac);

    for n in 0..SLOTS.min(BLOCKS) {
        assert_eq!(rx.fill(&fills(slot(n))), 3);
    }
    let mut free_bufs: Vec<u64> = (0..TX_BUFS).map(|i| staging + i * TX_BUF).collect();
    let mut unsent: std::collections::VecDeque<Desc> = Default::default();
    let (mut sent, mut done, mut frame_in_block) = (0u64, 0u64, 0usize);
    let mut block = vec![0u8; BLOCK];
    let mut got = vec![0u8; BLOCK];
    let mut descs = Vec::new();
    let mut comps = Vec::new();
    let t = Instant::now();
    while done < BLOCKS {
        assert!(
            t.elapsed() < LIMIT,
            "{done} of {BLOCKS} blocks after {LIMIT:?}"
        );
        let mut progress = false;
        // Send within the window, each block's segments last first.
        while unsent.is_empty() && sent < BLOCKS && sent < done + WINDOW && free_bufs.len() >= 3 {
            pattern(sent, &mut block);
            for seg in (0..3).rev() {
                let addr = free_bufs.pop().unwrap();
                let off = seg_off(seg);
                tx_region
                    .write(addr, &header(dst, src, ETHERTYPE_DATA, field(sent, seg)))
                    .unwrap();
                tx_region
                    .write(addr + HDR as u64, &block[off..off + SEG[seg]])
                    .unwrap();
                unsent.push_back(Desc {
                    addr,
                    len: (HDR + SEG[seg]) as u32,
                });
            }
            sent += 1;
        }
        if !unsent.is_empty() {
            let (a, b) = unsent.as_slices();
            let batch: Vec<Desc> = a.iter().chain(b).copied().collect();
            let n = tx.transmit(&batch);
            unsent.drain(..n);
            progress |= n > 0;
        }
        comps.clear();
        if tx.completions(&mut comps, TX_BUFS as usize) > 0 {
            free_bufs.extend_from_slice(&comps);
            progress = true;
        }
        descs.clear();
        rx.recv(&mut descs, 3 * WINDOW as usize);
        for d in &descs {
            progress = true;
            let b = slot(done);
            let seg = 2 - frame_in_block;
            let want = fills(b)[frame_in_block] + XDP_PACKET_HEADROOM;
            assert_eq!(d.addr, want, "block {done} segment {seg}: landing address");
            assert_eq!(d.len as usize, HDR + SEG[seg], "block {done} segment {seg}");
            frame_in_block += 1;
            if frame_in_block < 3 {
                continue;
            }
            frame_in_block = 0;
            // The whole block, through the file's second mapping.
            pattern(done, &mut block);
            second.read(b as usize, &mut got);
            if got != block {
                let at = got.iter().zip(&block).position(|(x, y)| x != y).unwrap();
                panic!("block {done} differs at byte {at}");
            }
            let mut front = [0u8; HDR];
            second.read(b as usize - HDR, &mut front);
            assert_eq!(front, header(dst, src, ETHERTYPE_DATA, field(done, 0)));
            let next = done + SLOTS;
            if next < BLOCKS {
                assert_eq!(rx.fill(&fills(b)), 3);
            }
            done += 1;
        }
        if !progress {
            rx.wait(Duration::from_millis(1)).unwrap();
        }
    }
    let stats = rx.statistics().unwrap();
    assert_eq!(stats.rx_dropped, 0, "{stats:?}");
    // Nothing outside the blocks and the 16 bytes before each was written.
    let mut all = vec![0u8; rx_len];
    second.read(0, &mut all);
    let mut owned = vec![false; rx_len];
    for s in 0..SLOTS.min(BLOCKS) {
        let b = slot(s) as usize;
        owned[b - HDR..b + BLOCK].iter_mut().for_each(|o| *o = true);
    }
    let stray = (0..rx_len).find(|&i| !owned[i] && all[i] != CANARY);
    assert_eq!(stray, None, "a byte outside the blocks was written");
    eprintln!(
        "{BLOCKS} blocks in {:.2?} ({:.0} blocks/s)",
        t.elapsed(),
        BLOCKS as f64 / t.elapsed().as_secs_f64()
    );
}
