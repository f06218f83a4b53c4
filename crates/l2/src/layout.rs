//! Where a block or an extent's frames land, and in which order they are sent.
//!
//! An extent of `n` blocks (`n * BLOCK_SIZE` bytes at offset `B` of the receiver's
//! region) is cut into segments of at most [`MAX_PAYLOAD`] bytes. The **first** segment
//! (lowest address) is the short one and the others are full, so the frame that lands
//! at the highest address is a full-size frame: a frame of any legal length that lands
//! in any of the extent's receive slots (after a loss shifted the descriptors) still
//! stays inside `[B - HEADER_LEN, B + n * BLOCK_SIZE)`.
//!
//! Segment `i` with data at `B + start_i` is received through the fill address
//! `B + start_i - HEADER_LEN - XDP_PACKET_HEADROOM`: the kernel writes the frame (its
//! header, then the payload) at fill + 256, so the payload lands at `B + start_i`. The
//! frames go last segment first; each header lands in the bytes of the segment below,
//! which the next frame overwrites, so the extent is contiguous and only segment 0's
//! header survives, in the `HEADER_LEN` bytes in front of the extent (clobbered).

use crate::frame::{HEADER_LEN, MAX_PAYLOAD};
use crate::{BLOCK_SIZE, MAX_EXTENT_BLOCKS};
use zcfs_xsk::{UMEM_CHUNK_SIZE, XDP_PACKET_HEADROOM};

/// Bytes of the receiver's region an extent needs in front of it: the kernel's
/// headroom (untouched) and the header that survives (clobbered).
pub const MIN_FRONT: u64 = XDP_PACKET_HEADROOM + HEADER_LEN as u64;

/// Bytes of the receiver's region an extent needs behind it. The kernel takes a fill
/// address `a` only if `a + UMEM_CHUNK_SIZE <= region length` (xp_check_unaligned; an
/// entry that fails is consumed and skipped, so every later frame would land one entry
/// early). An extent's highest fill address is its last segment's, a full one: `end -
/// MAX_PAYLOAD - MIN_FRONT`, so the chunk from there reaches `end + MIN_TAIL`.
pub const MIN_TAIL: u64 = UMEM_CHUNK_SIZE as u64 - MIN_FRONT - MAX_PAYLOAD as u64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("an extent of {0} blocks is outside 1..={MAX_EXTENT_BLOCKS}")]
    Blocks(u32),
    #[error("an extent at {0} has fewer than {MIN_FRONT} bytes of region in front of it")]
    Front(u64),
    #[error("an extent at {offset} of {blocks} blocks (and the {MIN_TAIL} bytes behind it the kernel's receive chunk needs) ends beyond the region ({size} bytes)")]
    End {
        offset: u64,
        blocks: u32,
        size: usize,
    },
    #[error("extents at {a} and {b} (with the {HEADER_LEN} clobbered bytes in front) overlap")]
    Overlap { a: u64, b: u64 },
    #[error("slot geometry: {0}")]
    Geometry(&'static str),
}

/// Contiguous whole blocks at `offset` of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub blocks: u32,
}

impl Extent {
    pub fn bytes(&self) -> u64 {
        self.blocks as u64 * BLOCK_SIZE as u64
    }
    /// The bytes frames may write when this extent is received: the clobbered front and
    /// the extent.
    pub fn touched(&self) -> (u64, u64) {
        (self.offset - HEADER_LEN as u64, self.offset + self.bytes())
    }

    /// Check that the extent can be received into a region of `size` bytes.
    pub fn check_receivable(&self, size: usize) -> Result<(), LayoutError> {
        if self.blocks == 0 || self.blocks > MAX_EXTENT_BLOCKS {
            return Err(LayoutError::Blocks(self.blocks));
        }
        if self.offset < MIN_FRONT {
            return Err(LayoutError::Front(self.offset));
        }
        match self
            .offset
            .checked_add(self.bytes())
            .and_then(|end| end.checked_add(MIN_TAIL))
        {
            Some(end) if end <= size as u64 => Ok(()),
            _ => Err(LayoutError::End {
                offset: self.offset,
                blocks: self.blocks,
                size,
            }),
        }
    }

    /// Check that the extent can be sent from a region of `size` bytes.
    pub fn check_sendable(&self, size: usize) -> Result<(), LayoutError> {
        if self.blocks == 0 || self.blocks > MAX_EXTENT_BLOCKS {
            return Err(LayoutError::Blocks(self.blocks));
        }
        match self.offset.checked_add(self.bytes()) {
            Some(end) if end <= size as u64 => Ok(()),
            _ => Err(LayoutError::End {
                offset: self.offset,
                blocks: self.blocks,
                size,
            }),
        }
    }
}

/// Whether the touched ranges of two receivable extents overlap.
pub fn overlaps(a: &Extent, b: &Extent) -> bool {
    let (a0, a1) = a.touched();
    let (b0, b1) = b.touched();
    a0 < b1 && b0 < a1
}

/// One segment of an extent: `len` bytes at `start` from the extent's first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub index: u16,
    pub start: u32,
    pub len: u32,
}

impl Segment {
    /// The frame's length on the wire.
    pub fn frame_len(&self) -> u32 {
        self.len + HEADER_LEN as u32
    }
}

/// How many frames an extent of `blocks` blocks takes.
pub fn frames(blocks: u32) -> usize {
    (blocks as usize * BLOCK_SIZE).div_ceil(MAX_PAYLOAD)
}

/// The segments of an extent of `blocks` blocks in **send order** (highest first).
pub fn segments(blocks: u32) -> Vec<Segment> {
    let total = blocks as usize * BLOCK_SIZE;
    let n = frames(blocks);
    let first = total - (n - 1) * MAX_PAYLOAD;
    (0..n)
        .rev()
        .map(|i| {
            let (start, len) = if i == 0 {
                (0, first)
            } else {
                (first + (i - 1) * MAX_PAYLOAD, MAX_PAYLOAD)
            };
            Segment {
                index: i as u16,
                start: start as u32,
                len: len as u32,
            }
        })
        .collect()
}

/// A receive descriptor to post: the fill address and the length of the frame planned
/// to land through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    pub fill: u64,
    pub len: u32,
}

/// The fill entries for receiving `ext`, in the order they must be posted (the send
/// order). `ext` must be receivable (`offset >= MIN_FRONT`).
pub fn fill_plan(ext: &Extent) -> Vec<Planned> {
    segments(ext.blocks)
        .into_iter()
        .map(|s| Planned {
            fill: ext.offset + s.start as u64 - HEADER_LEN as u64 - XDP_PACKET_HEADROOM,
            len: s.frame_len(),
        })
        .collect()
}

/// The receive-slot geometry a receiver announces: `slots` slots of `slot_blocks`
/// blocks, slot `i`'s first block at `first + i * stride`. Valid when every slot has
/// [`MIN_FRONT`] bytes of region in front, a gap of at least [`HEADER_LEN`] bytes
/// between one slot's end and the next slot's first block (the clobbered header), and
/// [`MIN_TAIL`] bytes of region behind the last slot (the kernel's receive chunk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotGeometry {
    pub first: u64,
    pub stride: u64,
    pub slot_blocks: u32,
    pub slots: u32,
}

/// Encoded length of a [`SlotGeometry`].
pub const GEOMETRY_LEN: usize = 24;

impl SlotGeometry {
    /// A geometry with the smallest gap, the first slot at `first`.
    pub fn packed(first: u64, slot_blocks: u32, slots: u32) -> SlotGeometry {
        SlotGeometry {
            first,
            stride: slot_blocks as u64 * BLOCK_SIZE as u64 + HEADER_LEN as u64,
            slot_blocks,
            slots,
        }
    }

    pub fn check(&self, region_len: usize) -> Result<(), LayoutError> {
        if self.slot_blocks == 0 || self.slot_blocks > MAX_EXTENT_BLOCKS {
            return Err(LayoutError::Blocks(self.slot_blocks));
        }
        if self.slots == 0 {
            return Err(LayoutError::Geometry("no slots"));
        }
        if self.first < MIN_FRONT {
            return Err(LayoutError::Front(self.first));
        }
        if self.stride < self.slot_blocks as u64 * BLOCK_SIZE as u64 + HEADER_LEN as u64 {
            return Err(LayoutError::Geometry(
                "stride leaves no gap for the clobbered header",
            ));
        }
        let last = self
            .slot(self.slots - 1)
            .ok_or(LayoutError::Geometry("too large"))?;
        last.check_receivable(region_len)
    }

    /// Slot `i` as an extent, if it exists.
    pub fn slot(&self, i: u32) -> Option<Extent> {
        if i >= self.slots {
            return None;
        }
        let offset = (i as u64)
            .checked_mul(self.stride)?
            .checked_add(self.first)?;
        Some(Extent {
            offset,
            blocks: self.slot_blocks,
        })
    }

    pub fn encode(&self) -> [u8; GEOMETRY_LEN] {
        let mut b = [0u8; GEOMETRY_LEN];
        b[0..8].copy_from_slice(&self.first.to_le_bytes());
        b[8..16].copy_from_slice(&self.stride.to_le_bytes());
        b[16..20].copy_from_slice(&self.slot_blocks.to_le_bytes());
        b[20..24].copy_from_slice(&self.slots.to_le_bytes());
        b
    }

    /// Decode a peer's announcement and check it against the peer's region size.
    pub fn decode(b: &[u8; GEOMETRY_LEN], region_len: usize) -> Result<SlotGeometry, LayoutError> {
        let g = SlotGeometry {
            first: u64::from_le_bytes(b[0..8].try_into().expect("8")),
            stride: u64::from_le_bytes(b[8..16].try_into().expect("8")),
            slot_blocks: u32::from_le_bytes(b[16..20].try_into().expect("4")),
            slots: u32::from_le_bytes(b[20..24].try_into().expect("4")),
        };
        g.check(region_len)?;
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{build, Body, Macs, TagKey};
    use crate::sim::{Injector, SimLink};
    use zcfs_xsk::{Desc, FrameIo};

    #[test]
    fn a_block_is_three_frames_short_one_first() {
        let s = segments(1);
        assert_eq!(s.len(), 3);
        assert_eq!(s.iter().map(|s| s.index).collect::<Vec<_>>(), [2, 1, 0]);
        assert_eq!(s[2].start, 0);
        assert_eq!(s[2].len as usize, BLOCK_SIZE - 2 * MAX_PAYLOAD);
        assert_eq!(s[0].len as usize, MAX_PAYLOAD);
        assert_eq!(s[0].frame_len() as usize, crate::MAX_FRAME_LEN);
        assert_eq!(s.iter().map(|s| s.len as usize).sum::<usize>(), BLOCK_SIZE);
    }

    #[test]
    fn extents_at_the_bound() {
        let ext = Extent {
            offset: MIN_FRONT,
            blocks: MAX_EXTENT_BLOCKS,
        };
        let size = (MIN_FRONT + ext.bytes() + MIN_TAIL) as usize;
        assert_eq!(ext.check_receivable(size), Ok(()));
        assert!(ext.check_receivable(size - 1).is_err());
        // At the bound the highest fill address's chunk ends at the region's end, for
        // every extent size (the kernel's rule, xp_check_unaligned).
        for blocks in 1..=MAX_EXTENT_BLOCKS {
            let size = 1 << 20;
            let ext = Extent {
                offset: size - MIN_TAIL - blocks as u64 * BLOCK_SIZE as u64,
                blocks,
            };
            assert_eq!(ext.check_receivable(size as usize), Ok(()));
            let worst = fill_plan(&ext).iter().map(|p| p.fill).max().unwrap();
            assert_eq!(worst + UMEM_CHUNK_SIZE as u64, size, "{blocks} blocks");
            let further = Extent {
                offset: ext.offset + 1,
                ..ext
            };
            assert!(further.check_receivable(size as usize).is_err());
        }
        let over = Extent {
            blocks: MAX_EXTENT_BLOCKS + 1,
            ..ext
        };
        assert_eq!(
            over.check_receivable(usize::MAX),
            Err(LayoutError::Blocks(MAX_EXTENT_BLOCKS + 1))
        );
        let front = Extent {
            offset: MIN_FRONT - 1,
            blocks: 1,
        };
        assert_eq!(
            front.check_receivable(1 << 20),
            Err(LayoutError::Front(MIN_FRONT - 1))
        );
        assert_eq!(
            fill_plan(&Extent {
                offset: MIN_FRONT,
                blocks: 1
            })
            .last()
            .unwrap()
            .fill,
            0,
            "the lowest fill address of an extent at MIN_FRONT is the region's first byte"
        );
    }

    #[test]
    fn slot_geometry_checks_the_gap_and_round_trips() {
        let g = SlotGeometry::packed(MIN_FRONT, 2, 4);
        let need = (g.slot(3).unwrap().offset + g.slot(3).unwrap().bytes() + MIN_TAIL) as usize;
        assert_eq!(g.check(need), Ok(()));
        assert_eq!(SlotGeometry::decode(&g.encode(), need), Ok(g));
        assert!(g.check(need - 1).is_err());
        let tight = SlotGeometry {
            stride: g.stride - 1,
            ..g
        };
        assert!(tight.check(1 << 30).is_err());
        assert!(!overlaps(&g.slot(0).unwrap(), &g.slot(1).unwrap()));
        assert!(overlaps(&tight.slot(0).unwrap(), &tight.slot(1).unwrap()));
    }

    /// Send `ext_blocks` blocks from `a` into `ext` of `b` as planned, through the
    /// simulator, and return the receiver's region and descriptors.
    fn land(ext: Extent, region: usize) -> (crate::sim::SimEnd, Vec<Desc>, Vec<u8>) {
        let (mut a, mut b) = SimLink::pair(1 << 20, region, Injector::none(1));
        let key = TagKey::derive(b"k");
        let macs = Macs {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
        };
        let data: Vec<u8> = (0..ext.bytes()).map(|i| (i * 7 + i / 4096) as u8).collect();
        let plan = fill_plan(&ext);
        let fills: Vec<u64> = plan.iter().map(|p| p.fill).collect();
        assert_eq!(b.fill(&fills), fills.len());
        let crc = crc32c::crc32c(&data);
        let mut descs = Vec::new();
        for (k, s) in segments(ext.blocks).iter().enumerate() {
            let body = Body::Data {
                seg: s.index,
                epoch: 0,
                group: 0,
                transfer: 1,
                block: 0,
                crc,
            };
            let f = build(
                macs,
                &body,
                &data[s.start as usize..(s.start + s.len) as usize],
                &key,
            );
            let at = (k * 2048) as u64;
            a.region().write(at, &f).unwrap();
            descs.push(Desc {
                addr: at,
                len: f.len() as u32,
            });
        }
        assert_eq!(a.transmit(&descs), descs.len());
        let mut got = Vec::new();
        b.recv(&mut got, 1024);
        (b, got, data)
    }

    fn lands_in_place(blocks: u32) {
        let region = 64 << 10;
        let ext = Extent {
            offset: 8192,
            blocks,
        };
        let (b, got, data) = {
            let (b, got, data) = land(ext, region + ext.bytes() as usize);
            (b, got, data)
        };
        let plan = fill_plan(&ext);
        assert_eq!(got.len(), plan.len());
        for (d, p) in got.iter().zip(&plan) {
            assert_eq!(d.addr, p.fill + XDP_PACKET_HEADROOM);
            assert_eq!(d.len, p.len);
        }
        let mut all = vec![0u8; b.region().len()];
        b.region().read(0, &mut all).unwrap();
        let (lo, hi) = (ext.offset as usize, (ext.offset + ext.bytes()) as usize);
        assert_eq!(&all[lo..hi], &data[..], "the extent landed byte for byte");
        let changed: Vec<usize> = all
            .iter()
            .enumerate()
            .filter(|(i, &v)| v != 0 && (*i < lo || *i >= hi))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(changed.first().copied(), Some(lo - HEADER_LEN));
        assert!(
            changed.iter().all(|&i| i >= lo - HEADER_LEN && i < lo),
            "only the {HEADER_LEN} bytes in front were written: {changed:?}"
        );
        // The surviving header is segment 0's.
        let (body, _) = crate::frame::decode(
            &all[lo - HEADER_LEN..lo + 8],
            Macs {
                dst: [2, 0, 0, 0, 0, 2],
                src: [2, 0, 0, 0, 0, 1],
            },
            &TagKey::derive(b"k"),
        )
        .unwrap();
        assert!(matches!(body, Body::Data { seg: 0, .. }));
    }

    #[test]
    fn a_block_lands_byte_for_byte_and_only_the_front_is_clobbered() {
        lands_in_place(1);
    }

    #[test]
    fn an_extent_of_the_largest_size_lands_byte_for_byte() {
        lands_in_place(3);
        lands_in_place(MAX_EXTENT_BLOCKS);
    }
}
