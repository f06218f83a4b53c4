//! zcfs's layer-2 protocol (issue 12): blocks and commands as raw Ethernet frames over
//! AF_XDP, placed by the receiver straight where they belong.
//!
//! - [`frame`]: the wire format (docs/protocol.md, "Layer-2 frames"), with a tag from
//!   the session key on every frame.
//! - [`layout`]: how a block or an extent is cut into frames that land contiguous in
//!   place under the kernel's landing rule, and the receive-slot geometry.
//! - [`endpoint`]: the protocol's state machines (commands, and data transfers with
//!   credit flow control, per-descriptor checks, CRC32C, acknowledgements,
//!   retransmission of whole extents and resynchronisation), IO-agnostic.
//! - [`sim`]: a simulator of the kernel's measured landing rule, for tests.
//! - [`inject`]: a test tool that loses, duplicates and reorders the frames a real
//!   socket transmits.
//!
//! # How the real socket plugs in
//!
//! [`endpoint::Endpoint`] is generic over two [`zcfs_xsk::FrameIo`]s: the data queue and the
//! command queue. In tests both are [`sim::SimEnd`]s; in the transport they are two
//! AF_XDP sockets from `zcfs-xsk` bound to two queues of the same interface (a real NIC
//! steers EtherType 0x88B6 to the command queue with an ntuple rule; on veth the XDP
//! program redirects by EtherType to the right XSKMAP entry), so commands never take a
//! data slot from the fill ring. The data socket's UMEM is the server's PM mapping or the
//! client's receive buffer; the caller chooses the extents frames land in
//! ([`endpoint::Endpoint::expect`]) and the extents they are sent from
//! ([`endpoint::Endpoint::send`]) and must leave [`endpoint::Config::tx_scratch`] (and, on the
//! command queue, the whole region) to the endpoint. The endpoint never blocks: the
//! caller calls [`endpoint::Endpoint::poll`] with the current time (any monotonic
//! nanosecond clock; the tests use a simulated one) and may sleep in `FrameIo::wait`
//! for at most a fraction of [`endpoint::Config::rto_ns`] between polls.

pub mod endpoint;
pub mod frame;
pub mod inject;
pub mod layout;
pub mod sim;

pub use endpoint::{Config, Endpoint, Event, L2Error, Stats};
pub use frame::{FrameError, TagKey, HEADER_LEN, MAX_PAYLOAD};
pub use layout::{Extent, SlotGeometry, MIN_FRONT, MIN_TAIL};
pub use zcfs_xsk::ETH_HEADER_LEN;

/// How a layer-2 endpoint's user waits for frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L2Poll {
    /// Spin on the rings (one core busy; lowest latency on an idle machine). A client's
    /// waiter yields its CPU between polls to any thread ready there; the server's lane
    /// thread spins without yielding.
    Busy,
    /// Sleep in poll(2) between polls.
    Wait,
}

impl std::str::FromStr for L2Poll {
    type Err = String;
    fn from_str(s: &str) -> Result<L2Poll, String> {
        match s {
            "busy" => Ok(L2Poll::Busy),
            "wait" => Ok(L2Poll::Wait),
            o => Err(format!("l2 poll mode {o:?}: busy or wait")),
        }
    }
}

/// The interface MTU the frames are sized for (bytes after the Ethernet header).
pub const MTU: usize = 1500;
/// The longest frame: Ethernet header and MTU.
pub const MAX_FRAME_LEN: usize = ETH_HEADER_LEN + MTU;
/// Polls in a row a waiting (poll(2)) lane end makes without sleeping while frames wait
/// to go and none went (their TX chunks not back yet): then it sleeps its slice. A link
/// that went down mid-transfer never gives the chunks back; without the bound a waiting
/// client spun a core until its reply timeout (review 28c).
pub const MAX_IDLE_TX_POLLS: u32 = 64;
/// The file system's block size.
pub const BLOCK_SIZE: usize = 4096;
/// The most blocks one extent (one group of frames sent last first) holds.
pub const MAX_EXTENT_BLOCKS: u32 = 32;
/// The most extents one transfer holds.
pub const MAX_TRANSFER_EXTENTS: usize = 64;
/// The most bytes of one command (request or reply): one command frame's payload.
pub const MAX_COMMAND: usize = MAX_PAYLOAD;

#[cfg(test)]
mod xdp_program_tests {
    /// zcfs's XDP program drops frames of zcfs's EtherTypes longer than the protocol's
    /// longest (a receiver leaves no more room behind its slots): its bound is this
    /// crate's.
    #[test]
    fn the_xdp_program_drops_frames_longer_than_the_protocols_longest() {
        let src = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../xsk/bpf/zcfs_xdp.c"
        ));
        let line = src
            .lines()
            .find(|l| l.starts_with("#define MAX_FRAME_LEN "))
            .expect("the XDP program defines MAX_FRAME_LEN");
        let n: usize = line["#define MAX_FRAME_LEN ".len()..]
            .trim()
            .parse()
            .unwrap();
        assert_eq!(n, super::MAX_FRAME_LEN);
        assert!(src.contains("if (data + MAX_FRAME_LEN < data_end)\n            return XDP_DROP;"));
    }
}
