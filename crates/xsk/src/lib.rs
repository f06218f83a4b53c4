//! AF_XDP for zcfs's layer-2 transport (issue 12; see `../shared/research/afxdp.md`).
//!
//! This crate is the lowest layer of the layer-2 path: it moves raw Ethernet frames and
//! knows nothing of zcfs's protocol. It holds
//! - [`FrameIo`], the seam between the protocol (crate `zcfs-l2`) and whatever moves the
//!   frames: the real AF_XDP socket here, or `zcfs-l2`'s simulator of the kernel's
//!   measured landing rule in unprivileged tests;
//! - [`Region`], the memory a socket's frames land in and leave from (the UMEM): on a
//!   server the PM volume's mapping, on a client its receive buffers;
//! - [`Desc`], a frame descriptor as the rings carry it.

mod error;
mod region;
mod socket;
mod xdp;

pub use error::XskError;
pub use region::{Region, RegionError, MAX_REGION_LEN};
pub use socket::{
    bind_retrying, ifindex, mac_address, BindMode, XskConfig, XskSocket, XskStats, BIND_TRIES,
    BUSY_POLL_BUDGET, BUSY_POLL_USECS, COMPLETION_RING_SIZE, FILL_RING_SIZE, RX_RING_SIZE,
    TX_ADDR_ALIGN, TX_RING_SIZE, UMEM_CHUNK_SIZE, UNALIGNED_OFFSET_SHIFT,
};
pub use xdp::{xdp_object_available, AttachMode, XdpProgram, XSKMAP_ENTRIES};

use std::io;
use std::time::Duration;

/// zcfs's EtherType for data frames (blocks), from the IEEE 802 local experimental range.
pub const ETHERTYPE_DATA: u16 = 0x88B5;
/// zcfs's EtherType for command frames (request and reply headers).
pub const ETHERTYPE_COMMAND: u16 = 0x88B6;
/// Bytes the kernel leaves untouched in front of a received frame: a frame whose fill
/// address is `a` is written at `a + XDP_PACKET_HEADROOM` (measured in copy mode, and
/// XDP_PACKET_HEADROOM in the kernel source), with a UMEM headroom of 0.
pub const XDP_PACKET_HEADROOM: u64 = 256;
/// Length of an Ethernet header (destination MAC, source MAC, EtherType).
pub const ETH_HEADER_LEN: usize = 14;

/// A frame as AF_XDP's RX and TX rings describe it: `addr` is the offset in the socket's
/// [`Region`] of the frame's first byte (the destination MAC), `len` its length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
}

/// What the layer-2 protocol needs of one AF_XDP socket (one queue). The real socket
/// and the landing-rule simulator both implement it, so the protocol's segmentation,
/// reassembly, loss handling and resynchronisation are tested without privileges.
///
/// The rings are those of AF_XDP: the fill ring (receive buffers posted, consumed in
/// order, one per arriving frame), the RX ring (frames that arrived), the TX ring
/// (frames to send, already written in the region) and the completion ring (TX frames
/// whose memory may be reused).
pub trait FrameIo {
    /// The memory frames land in and are sent from.
    fn region(&self) -> &Region;
    /// Post receive buffers in this order. The next frame that arrives takes the oldest
    /// posted address `a` and is written at `a + XDP_PACKET_HEADROOM`; a frame that
    /// arrives while none is posted is dropped. Returns how many were posted (fewer when
    /// the ring is full).
    fn fill(&mut self, addrs: &[u64]) -> usize;
    /// How many more receive buffers the fill ring takes now.
    fn fill_free(&self) -> usize;
    /// Move up to `max` arrived frames into `out` (appended), oldest first; returns how many.
    fn recv(&mut self, out: &mut Vec<Desc>, max: usize) -> usize;
    /// Queue frames for sending, in this order, and wake the kernel; returns how many
    /// were queued (fewer when the TX ring is full). Their memory must stay untouched
    /// until [`FrameIo::completions`] returns their addresses.
    fn transmit(&mut self, frames: &[Desc]) -> usize;
    /// Move up to `max` addresses of sent frames whose memory may be reused into `out`.
    fn completions(&mut self, out: &mut Vec<u64>, max: usize) -> usize;
    /// Wait until a frame has arrived or `timeout` passed (`Ok(false)`).
    fn wait(&mut self, timeout: Duration) -> io::Result<bool>;
}
