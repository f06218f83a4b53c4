//! The protocol's state machines: one [`Endpoint`] per peer, over a data queue and a
//! command queue (two [`FrameIo`]s). IO-agnostic: the caller calls [`Endpoint::poll`]
//! with the current time; nothing blocks and nothing reads a clock.
//!
//! **Commands** (opaque bytes, at most [`MAX_COMMAND`]) travel one per command frame
//! with a sequence number and a cumulative ack, go-back-N retransmission after
//! [`Config::rto_ns`], at most [`CMD_WINDOW`] unacknowledged. The command queue's region
//! is scratch memory in [`CMD_CHUNK`]-byte chunks: [`CMD_RX_CHUNKS`] posted to the fill
//! ring (each frame lands whole in its own chunk, so a lost command frame shifts
//! nothing), then [`CMD_TX_CHUNKS`] for sending.
//!
//! **Data transfers** (receiver side, [`Endpoint::expect`]): the receiver chooses the
//! extents a transfer lands in and gives the transfer its id. It posts each extent's
//! fill entries as one *group* (numbered in posting order) while the posted but
//! unconsumed entries stay within the credit window [`Config::credit_frames`], and
//! grants each group to the sender in a control record. The sender
//! ([`Endpoint::send`]) sends granted groups strictly in group order, each last frame
//! first, and never a group it was not granted, so it never has more frames in flight
//! than the receiver posted. When all descriptors of a group have arrived the receiver
//! checks each descriptor's address and length against the plan, the surviving header
//! in front of the extent (kind, segment 0, epoch, group, transfer, first block, tag)
//! and the CRC32C of the extent against the header's. A transfer is handed up
//! ([`Event::Committed`]) once, when every extent has passed, and the sender is told
//! ([`Event::Delivered`] there).
//!
//! **Resynchronisation.** A failed check, or posted entries with no frame arriving for
//! an RTO (a loss at the end, a lost grant), starts a *drain*: the receiver abandons
//! every posted group (their extents go back to be posted again, so retransmission is of
//! whole extents), raises the epoch and asks the sender for as many NOP frames as it has
//! unconsumed entries. The sender drops the old epoch's grants, sends the NOPs and
//! answers DRAINED once every frame it gave the kernel has completed (none of them can
//! land after the receiver posts again). When that answer is in, no entry is left and no frame arrived for
//! [`Config::quiet_ns`], the receiver posts again under the new epoch. Frames of the old
//! epoch that still turn up fail the header check and start another drain. NOPs that
//! find no entry are dropped by the kernel, harmlessly.
//!
//! **Skips and cancels.** A sender whose next granted group belongs to a transfer it
//! does not have waits `rto_ns / SKIP_HOLD_RTO_DIVISOR` for [`Endpoint::send`] (a read's
//! groups are posted before the request goes, and must not cost a round trip), then
//! fills the group with tagged NOPs naming the group and transfer (a *skip*), so the
//! groups after it stay in step. The receiver parks a skipped transfer until the sender
//! says READY (or asks STATUS). [`Endpoint::cancel`] gives up a transfer being
//! received: the sender is told (UNKNOWN) and skips its granted groups at once.
//!
//! **Timeouts.** A transfer of which no extent passed for
//! [`Config::transfer_timeout_ns`] is aborted ([`Event::Aborted`]: it will never be
//! committed); its memory is the caller's again when no fill entry points into it
//! ([`Event::SlotsFree`]), which needs a drain, so a new session ([`Endpoint::rekey`])
//! on the same sockets first drains what the old one left posted.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use zcfs_xsk::{Desc, FrameIo, RegionError, TX_ADDR_ALIGN, XDP_PACKET_HEADROOM};

use crate::frame::{self, Body, Macs, TagKey, HEADER_LEN, NOP_FRAME_LEN};
use crate::layout::{self, Extent, LayoutError, Planned};
use crate::{MAX_COMMAND, MAX_FRAME_LEN, MAX_TRANSFER_EXTENTS};

/// Bytes of one chunk of scratch memory (command queue, and the data sender's frames):
/// the kernel's headroom and the longest frame fit.
pub const CMD_CHUNK: u64 = 2048;
// Scratch chunks are sent from: they start at TX_ADDR_ALIGN multiples.
const _: () = assert!(CMD_CHUNK.is_multiple_of(TX_ADDR_ALIGN));
/// Command-queue chunks posted for receiving.
pub const CMD_RX_CHUNKS: u32 = 128;
/// Command-queue chunks for sending.
pub const CMD_TX_CHUNKS: u32 = 128;
/// The command queue's region must be at least this long.
pub const CMD_REGION_LEN: usize = ((CMD_RX_CHUNKS + CMD_TX_CHUNKS) as u64 * CMD_CHUNK) as usize;
/// Commands sent and not yet acknowledged, at most.
pub const CMD_WINDOW: usize = 32;
/// Commands queued behind the window, at most ([`L2Error::Busy`] beyond).
pub const MAX_QUEUED_COMMANDS: usize = 1024;
/// The largest credit window: posted, unconsumed data fill entries.
pub const MAX_CREDIT_FRAMES: usize = 1024;
/// Transfers one endpoint receives, or sends, at once.
pub const MAX_ACTIVE_TRANSFERS: usize = 256;
/// Committed transfer ids the receiver remembers, to answer a sender that missed DONE.
pub const RECENT_DONE: usize = 1024;
/// Bytes of one control record.
pub const RECORD_LEN: usize = 20;
/// Data frames read from the RX ring per poll.
const RX_BATCH: usize = 1024;
/// A sender holding the next granted group of a transfer it does not have (not yet:
/// the receiver posts a read's groups before it asks for the read) waits
/// `rto_ns / SKIP_HOLD_RTO_DIVISOR` for it, then fills the group with NOPs (a *skip*)
/// so the groups granted after it go on; less than the RTO, so the receiver does not
/// take the wait for a loss and drain.
pub const SKIP_HOLD_RTO_DIVISOR: u64 = 2;
/// The most fill entries a receiver has posted (its fill ring), so the most NOPs a
/// drain can ask for.
pub const MAX_DRAIN_NOPS: u32 = zcfs_xsk::FILL_RING_SIZE;
const _: () = assert!(MAX_CREDIT_FRAMES <= MAX_DRAIN_NOPS as usize);
const _: () = assert!(crate::sim::FILL_RING <= MAX_DRAIN_NOPS as usize);
/// A bare acknowledgement or a DONE record waits up to `rto_ns /
/// ACK_DELAY_RTO_DIVISOR` for a frame to ride with (delayed acks): well under the RTO,
/// so the peer does not retransmit for want of it.
pub const ACK_DELAY_RTO_DIVISOR: u64 = 4;
/// Control records waiting to be sent, at most (they are unreliable: a record beyond
/// is dropped and counted, and the timers recover as from a lost one).
pub const MAX_QUEUED_RECORDS: usize = 4096;
/// Transfers a sender remembers as missing (granted, not had), skipped, or given up by
/// the receiver.
const MAX_SENDER_MEMORY: usize = RECENT_DONE;
/// Protocol events (drains, their answers, posting again, aborts) an endpoint keeps for
/// [`Endpoint::debug_state`], the oldest forgotten first.
pub const TRACE_LEN: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum L2Error {
    #[error("command of {0} bytes is outside 1..={MAX_COMMAND}")]
    CommandSize(usize),
    #[error("too many commands queued ({MAX_QUEUED_COMMANDS})")]
    Busy,
    #[error("a transfer has {0} extents, outside 1..={MAX_TRANSFER_EXTENTS}")]
    Extents(usize),
    #[error("too many transfers at once ({MAX_ACTIVE_TRANSFERS})")]
    TooManyTransfers,
    #[error("transfer {0} is already being sent")]
    DuplicateTransfer(u32),
    #[error("extent at {0} overlaps memory that is in use (another extent, a live transfer or the scratch area)")]
    InUse(u64),
    #[error("an extent of {frames} frames can never fit the credit window of {credit}")]
    ExceedsCredit { frames: usize, credit: usize },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("configuration: {0}")]
    Config(&'static str),
    #[error("the fill ring took {took} of {asked} entries although it had room")]
    FillRing { took: usize, asked: usize },
    #[error(transparent)]
    Region(#[from] RegionError),
    #[error("the data socket is gone (it could not be made again)")]
    DataSocketGone,
    #[error("the data socket is replaced only with no transfer under way")]
    TransfersActive,
}

/// Settings of one endpoint.
#[derive(Clone, Debug)]
pub struct Config {
    pub local_mac: [u8; 6],
    pub peer_mac: [u8; 6],
    /// Retransmission and stall timeout.
    pub rto_ns: u64,
    /// How long no data frame must arrive after a drain before posting again (longer
    /// than any frame stays on the link).
    pub quiet_ns: u64,
    /// A transfer with no progress for this long is aborted (receiver) or failed (sender).
    pub transfer_timeout_ns: u64,
    /// The credit window in frames, at most [`MAX_CREDIT_FRAMES`].
    pub credit_frames: usize,
    /// Scratch memory in the data region for frames being sent: offset and number of
    /// [`CMD_CHUNK`]-byte chunks.
    pub tx_scratch: (u64, u32),
    /// The session has no shared secret (its key is known to whoever saw the set-up):
    /// command and control tags cover the payload's keyed SipHash instead of the payload
    /// ([`TagKey::derive_open`]).
    pub open_tags: bool,
}

/// What happened, for the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A command from the peer, in order, once.
    Command(Vec<u8>),
    /// Receiver: every block of the transfer arrived and passed its checks; its bytes
    /// are in place. Once per transfer.
    Committed(u32),
    /// Receiver: the transfer timed out or its session ended; it will not be committed.
    Aborted(u32),
    /// Receiver: no fill entry points into the aborted transfer's extents any more.
    SlotsFree(u32),
    /// Sender: the peer committed the transfer.
    Delivered(u32),
    /// Sender: the peer does not have the transfer (aborted, unknown) or did not answer.
    Failed(u32),
}

/// Counters of one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub commands_sent: u64,
    pub command_retransmits: u64,
    pub commands_received: u64,
    pub command_duplicates: u64,
    /// Frames refused on the command queue (bad tag, wrong peer, malformed).
    pub refused: u64,
    pub data_frames_sent: u64,
    pub nops_sent: u64,
    pub groups_sent: u64,
    pub extents_verified: u64,
    /// Groups whose descriptors, surviving header or CRC did not check.
    pub groups_failed: u64,
    pub drains: u64,
    /// Drains started because posted entries saw no frame for an RTO (not a failed
    /// group): a loss at the end, a lost grant, or a sender that did not run.
    pub drains_stalled: u64,
    /// A drain asked again: no DRAINED within an RTO, or NOPs came short.
    pub drain_reasks: u64,
    /// Receiver: frames that arrived for abandoned (stale) groups or with nothing posted.
    pub stale_frames: u64,
    /// Sender: polls that held DRAINED back because frames sent before it had not all
    /// completed yet.
    pub drained_held: u64,
    /// The longest time between two polls (ns): how long the endpoint was not run.
    pub max_poll_gap_ns: u64,
    pub committed: u64,
    pub aborted: u64,
    /// Grants of an old epoch or an already sent group (duplicates, ignored).
    pub stale_grants: u64,
    /// Sender: granted groups filled with NOPs because the transfer was not there.
    pub groups_skipped: u64,
    /// Receiver: groups the sender filled with NOPs (its transfer waits for READY).
    pub skips_received: u64,
    /// Receiver: transfers cancelled by the caller.
    pub cancelled: u64,
    /// Control records dropped because [`MAX_QUEUED_RECORDS`] were waiting.
    pub records_dropped: u64,
    /// Batches handed to the command queue's kernel (one kick each).
    pub command_kicks: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rec {
    Grant {
        epoch: u32,
        group: u32,
        transfer: u32,
        extent: u32,
        blocks: u16,
    },
    Drain {
        epoch: u32,
        first_group: u32,
        id: u32,
        nops: u32,
    },
    Drained {
        epoch: u32,
        id: u32,
    },
    Done(u32),
    Unknown(u32),
    Status(u32),
    Ready(u32),
}

impl Rec {
    fn encode(&self, out: &mut Vec<u8>) {
        let (k, n, a, b, c, d) = match *self {
            Rec::Grant {
                epoch,
                group,
                transfer,
                extent,
                blocks,
            } => (1u8, blocks, epoch, group, transfer, extent),
            Rec::Drain {
                epoch,
                first_group,
                id,
                nops,
            } => (2, 0, epoch, first_group, id, nops),
            Rec::Drained { epoch, id } => (3, 0, epoch, 0, id, 0),
            Rec::Done(t) => (4, 0, 0, 0, t, 0),
            Rec::Unknown(t) => (5, 0, 0, 0, t, 0),
            Rec::Status(t) => (6, 0, 0, 0, t, 0),
            Rec::Ready(t) => (7, 0, 0, 0, t, 0),
        };
        out.push(k);
        out.push(0);
        out.extend_from_slice(&n.to_le_bytes());
        for v in [a, b, c, d] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn decode(r: &[u8]) -> Option<Rec> {
        let u = |at: usize| u32::from_le_bytes(r[at..at + 4].try_into().expect("4"));
        let n = u16::from_le_bytes([r[2], r[3]]);
        let (a, b, c, d) = (u(4), u(8), u(12), u(16));
        Some(match r[0] {
            1 => Rec::Grant {
                epoch: a,
                group: b,
                transfer: c,
                extent: d,
                blocks: n,
            },
            2 => Rec::Drain {
                epoch: a,
                first_group: b,
                id: c,
                nops: d,
            },
            3 => Rec::Drained { epoch: a, id: c },
            4 => Rec::Done(c),
            5 => Rec::Unknown(c),
            6 => Rec::Status(c),
            7 => Rec::Ready(c),
            _ => return None,
        })
    }
}

/// The time of a transfer begun between polls (`expect`, `send`), replaced by the next
/// poll's time: a transfer's clock starts when the endpoint next runs, not at the last
/// poll before it, which may be long ago.
const UNSTAMPED: u64 = u64::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RxState {
    Active,
    Aborted,
}

struct RxXfer {
    extents: Vec<Extent>,
    first_block: Vec<u32>,
    verified: Vec<bool>,
    nverified: usize,
    last_progress: u64,
    state: RxState,
    /// The sender skipped a group of it (it did not have the transfer): its extents
    /// are not posted again until the sender says READY (or asks STATUS).
    parked: bool,
    /// The sender said it has the transfer (READY or STATUS): a skip is re-posted.
    ready: bool,
}

struct Posted {
    group: u32,
    epoch: u32,
    transfer: u32,
    extent: u32,
    plan: Vec<Planned>,
    consumed: usize,
    ok: bool,
    /// Descriptors that arrived at their planned address with a NOP's length.
    nops: usize,
    stale: bool,
}

struct Drain {
    id: u32,
    issued: u64,
    acked: Option<u64>,
}

struct TxXfer {
    extents: Vec<Extent>,
    first_block: Vec<u32>,
    last_heard: u64,
}

#[derive(Clone, Copy)]
struct Grant {
    transfer: u32,
    extent: u32,
    blocks: u16,
}

/// One side of a layer-2 session.
pub struct Endpoint<D: FrameIo, C: FrameIo> {
    cfg: Config,
    key: TagKey,
    out_macs: Macs,
    in_macs: Macs,
    /// None only after a `replace_data` whose new socket could not be made: every call
    /// that needs it then fails with [`L2Error::DataSocketGone`].
    data: Option<D>,
    cmd: C,
    stats: Stats,
    events: Vec<Event>,
    now: u64,
    /// Polled at least once (`now` is a poll's time).
    polled: bool,
    /// Recent protocol events for [`Endpoint::debug_state`]: (time, what, a, b).
    trace: VecDeque<(u64, &'static str, u32, u32)>,
    /// A transfer was begun since the last poll and waits for its time stamp.
    unstamped: bool,
    // Commands.
    c_next_seq: u32,
    c_unacked: VecDeque<(u32, Vec<u8>)>,
    c_queue: VecDeque<Vec<u8>>,
    c_sent_at: u64,
    c_expected: u32,
    c_need_ack: bool,
    /// Since when a bare ack or a DONE record waits (see [`Endpoint::deferred_due`]).
    c_owed_since: Option<u64>,
    c_tx_free: Vec<u64>,
    ctl_out: Vec<Rec>,
    // Receiving data.
    r_transfers: HashMap<u32, RxXfer>,
    r_next_id: u32,
    r_posted: VecDeque<Posted>,
    r_unconsumed: usize,
    r_pending: VecDeque<(u32, u32)>,
    r_epoch: u32,
    r_next_group: u32,
    r_drain: Option<Drain>,
    r_drain_id: u32,
    r_last_rx: u64,
    r_last_post: u64,
    r_recent: VecDeque<u32>,
    r_recent_set: HashSet<u32>,
    // Sending data.
    s_transfers: HashMap<u32, TxXfer>,
    s_epoch: u32,
    s_next_group: u32,
    s_grants: BTreeMap<u32, Grant>,
    s_nops: u32,
    s_drain_done: Option<(u32, u32)>,
    s_drained_owed: bool,
    s_frames: VecDeque<Desc>,
    s_free: Vec<u64>,
    s_last_status: u64,
    /// Transfers granted at the head and not had: since when.
    s_missing: HashMap<u32, u64>,
    /// Transfers skipped (told READY when sent) and given up by the receiver (skipped
    /// at once), oldest first.
    s_skipped: Recent,
    s_gone: Recent,
}

/// A bounded set of transfer ids, the oldest forgotten first.
struct Recent {
    order: VecDeque<u32>,
    set: HashSet<u32>,
}

impl Recent {
    fn new() -> Recent {
        Recent {
            order: VecDeque::new(),
            set: HashSet::new(),
        }
    }
    fn insert(&mut self, id: u32) {
        if self.set.insert(id) {
            self.order.push_back(id);
            if self.order.len() > MAX_SENDER_MEMORY {
                let old = self.order.pop_front().expect("nonempty");
                self.set.remove(&old);
            }
        }
    }
    fn contains(&self, id: u32) -> bool {
        self.set.contains(&id)
    }
    fn remove(&mut self, id: u32) -> bool {
        if self.set.remove(&id) {
            self.order.retain(|x| *x != id);
            true
        } else {
            false
        }
    }
    fn clear(&mut self) {
        self.order.clear();
        self.set.clear();
    }
}

/// The scratch chunks of `(offset, count)` (`Config::tx_scratch`).
fn scratch_chunks((off, n): (u64, u32)) -> Vec<u64> {
    (0..n as u64).map(|i| off + i * CMD_CHUNK).collect()
}

fn first_blocks(extents: &[Extent]) -> Vec<u32> {
    let mut at = 0u32;
    extents
        .iter()
        .map(|e| {
            let b = at;
            at += e.blocks;
            b
        })
        .collect()
}

impl<D: FrameIo, C: FrameIo> Endpoint<D, C> {
    /// An endpoint of the session whose key is `session_key`, over the data queue
    /// `data` and the command queue `cmd`. Posts the command queue's receive chunks.
    pub fn new(cfg: Config, session_key: &[u8], data: D, mut cmd: C) -> Result<Self, L2Error> {
        if cfg.credit_frames == 0 || cfg.credit_frames > MAX_CREDIT_FRAMES {
            return Err(L2Error::Config(
                "credit_frames outside 1..=MAX_CREDIT_FRAMES",
            ));
        }
        if cmd.region().len() < CMD_REGION_LEN {
            return Err(L2Error::Config(
                "command region shorter than CMD_REGION_LEN",
            ));
        }
        let (off, n) = cfg.tx_scratch;
        let max_group = layout::frames(crate::MAX_EXTENT_BLOCKS) as u32;
        if n < max_group {
            return Err(L2Error::Config(
                "tx_scratch holds fewer chunks than the largest extent has frames",
            ));
        }
        if !off.is_multiple_of(TX_ADDR_ALIGN) {
            // The frames are sent from off + i * CMD_CHUNK; an odd address comes back
            // from the kernel's completion ring with bit 0 cleared (copy mode, 6.18).
            return Err(L2Error::Config(
                "tx_scratch offset is not a multiple of TX_ADDR_ALIGN",
            ));
        }
        match off.checked_add(n as u64 * CMD_CHUNK) {
            Some(end) if end <= data.region().len() as u64 => {}
            _ => return Err(L2Error::Config("tx_scratch lies beyond the data region")),
        }
        if cfg.rto_ns == 0 || cfg.transfer_timeout_ns < cfg.rto_ns {
            return Err(L2Error::Config(
                "rto_ns must be > 0 and <= transfer_timeout_ns",
            ));
        }
        if cfg.quiet_ns >= cfg.transfer_timeout_ns {
            // Every drain would outlast the transfer timeout: nothing posted during one
            // could make progress before it aborts.
            return Err(L2Error::Config("quiet_ns must be < transfer_timeout_ns"));
        }
        let rx: Vec<u64> = (0..CMD_RX_CHUNKS as u64).map(|i| i * CMD_CHUNK).collect();
        let took = cmd.fill(&rx);
        if took != rx.len() {
            return Err(L2Error::FillRing {
                took,
                asked: rx.len(),
            });
        }
        let c_tx_free = (CMD_RX_CHUNKS as u64..(CMD_RX_CHUNKS + CMD_TX_CHUNKS) as u64)
            .map(|i| i * CMD_CHUNK)
            .collect();
        let s_free = scratch_chunks(cfg.tx_scratch);
        Ok(Endpoint {
            key: TagKey::derive_for(session_key, cfg.open_tags),
            out_macs: Macs {
                dst: cfg.peer_mac,
                src: cfg.local_mac,
            },
            in_macs: Macs {
                dst: cfg.local_mac,
                src: cfg.peer_mac,
            },
            cfg,
            data: Some(data),
            cmd,
            stats: Stats::default(),
            events: Vec::new(),
            now: 0,
            polled: false,
            trace: VecDeque::new(),
            unstamped: false,
            c_next_seq: 0,
            c_unacked: VecDeque::new(),
            c_queue: VecDeque::new(),
            c_sent_at: 0,
            c_expected: 0,
            c_need_ack: false,
            c_owed_since: None,
            c_tx_free,
            ctl_out: Vec::new(),
            r_transfers: HashMap::new(),
            r_next_id: 1,
            r_posted: VecDeque::new(),
            r_unconsumed: 0,
            r_pending: VecDeque::new(),
            r_epoch: 0,
            r_next_group: 0,
            r_drain: None,
            r_drain_id: 0,
            r_last_rx: 0,
            r_last_post: 0,
            r_recent: VecDeque::new(),
            r_recent_set: HashSet::new(),
            s_transfers: HashMap::new(),
            s_epoch: 0,
            s_next_group: 0,
            s_grants: BTreeMap::new(),
            s_nops: 0,
            s_drain_done: None,
            s_drained_owed: false,
            s_frames: VecDeque::new(),
            s_free,
            s_last_status: 0,
            s_missing: HashMap::new(),
            s_skipped: Recent::new(),
            s_gone: Recent::new(),
        })
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// A readable dump of the endpoint's state (for a test that failed, e.g. a transfer
    /// aborted): receiver and sender side, the recent protocol events, the counters.
    /// Times are relative to the last poll.
    pub fn debug_state(&self) -> String {
        use std::fmt::Write;
        let now = self.now;
        let ago = |t: u64| {
            if t == UNSTAMPED {
                "unstamped".to_string()
            } else {
                format!("{:.3} ms ago", now.saturating_sub(t) as f64 / 1e6)
            }
        };
        let mut o = String::new();
        let _ = writeln!(o, "now {now} ns; {:?}", self.stats);
        let _ = writeln!(
            o,
            "receiver: epoch {} next group {} unconsumed {} posted groups {} pending extents {} last rx {} last post {}",
            self.r_epoch,
            self.r_next_group,
            self.r_unconsumed,
            self.r_posted.len(),
            self.r_pending.len(),
            ago(self.r_last_rx),
            ago(self.r_last_post),
        );
        if let Some(d) = &self.r_drain {
            let _ = writeln!(
                o,
                "  drain id {} issued {} acked {}",
                d.id,
                ago(d.issued),
                d.acked.map_or("no".to_string(), ago)
            );
        }
        for g in self.r_posted.iter().take(16) {
            let _ = writeln!(
                o,
                "  posted group {} epoch {} transfer {} extent {} frames {}/{} ok {} nops {} stale {}",
                g.group,
                g.epoch,
                g.transfer,
                g.extent,
                g.consumed,
                g.plan.len(),
                g.ok,
                g.nops,
                g.stale
            );
        }
        let mut ids: Vec<&u32> = self.r_transfers.keys().collect();
        ids.sort();
        for id in ids {
            let t = &self.r_transfers[id];
            let blocks: Vec<u32> = t.extents.iter().map(|e| e.blocks).collect();
            let _ = writeln!(
                o,
                "  rx transfer {id}: {:?} verified {}/{} blocks {blocks:?} progress {} parked {} ready {}",
                t.state,
                t.nverified,
                t.extents.len(),
                ago(t.last_progress),
                t.parked,
                t.ready
            );
        }
        let _ = writeln!(
            o,
            "sender: epoch {} next group {} grants {} (first {:?}) nops owed {} drained owed {} frames queued {} free chunks {} missing {:?}",
            self.s_epoch,
            self.s_next_group,
            self.s_grants.len(),
            self.s_grants.keys().next(),
            self.s_nops,
            self.s_drained_owed,
            self.s_frames.len(),
            self.s_free.len(),
            self.s_missing,
        );
        let mut ids: Vec<&u32> = self.s_transfers.keys().collect();
        ids.sort();
        for id in ids {
            let t = &self.s_transfers[id];
            let _ = writeln!(
                o,
                "  tx transfer {id}: {} extents, heard {}",
                t.extents.len(),
                ago(t.last_heard)
            );
        }
        let _ = writeln!(
            o,
            "commands: unacked {} queued {} records queued {}",
            self.c_unacked.len(),
            self.c_queue.len(),
            self.ctl_out.len()
        );
        for (t, what, a, b) in &self.trace {
            let _ = writeln!(o, "  {} {what} {a} {b}", ago(*t));
        }
        o
    }

    /// The data queue (its region holds received extents and sent sources); None only
    /// after a failed [`Endpoint::replace_data`].
    pub fn data(&self) -> Option<&D> {
        self.data.as_ref()
    }

    fn sock(&self) -> Result<&D, L2Error> {
        self.data.as_ref().ok_or(L2Error::DataSocketGone)
    }

    fn sock_mut(&mut self) -> Result<&mut D, L2Error> {
        self.data.as_mut().ok_or(L2Error::DataSocketGone)
    }

    /// Close the data socket and use the one `make` returns (on the same queue and
    /// memory) from now on: the only way to take back receive entries no peer will
    /// fill (a lane owner that went silent with a transfer's entries posted, whose
    /// drain needs that peer's NOPs). Every aborted transfer's memory is the caller's
    /// again ([`Event::SlotsFree`] at the next poll), and every scratch chunk is free.
    /// `make` runs after the old socket closed (a queue takes one socket at a time) and
    /// must return only once nothing can write into the old socket's entries any more
    /// (for AF_XDP: once the new socket is bound to the queue, which the old one's
    /// buffer pool left). Allowed only with no transfer under way in either direction
    /// (after [`Endpoint::rekey`]); else [`L2Error::TransfersActive`] and nothing
    /// changes. If `make` fails, its error is returned and the endpoint has no data
    /// socket (its data calls fail with [`L2Error::DataSocketGone`]).
    pub fn replace_data<E: From<L2Error>>(
        &mut self,
        make: impl FnOnce() -> Result<D, E>,
    ) -> Result<(), E> {
        let active = self
            .r_transfers
            .values()
            .any(|t| t.state != RxState::Aborted)
            || !self.s_transfers.is_empty();
        if active {
            return Err(L2Error::TransfersActive.into());
        }
        // The old socket (its posted entries and queued frames with it) goes first.
        self.data = None;
        self.data = Some(make()?);
        self.r_posted.clear();
        self.r_pending.clear();
        self.r_unconsumed = 0;
        self.r_drain = None;
        self.s_frames.clear();
        self.s_nops = 0;
        self.s_free = scratch_chunks(self.cfg.tx_scratch);
        self.note(
            "data socket replaced (aborted transfers, 0)",
            self.r_transfers.len() as u32,
            0,
        );
        self.release_check();
        debug_assert!(self.r_transfers.is_empty());
        Ok(())
    }

    /// Data frames wait to go: queued for the kernel, NOPs owed, or the next granted
    /// group is of a transfer this end sends (it waits for TX chunks to complete). No
    /// socket wakes a sleeper for that progress, so a caller that does not busy-poll
    /// should poll again soon instead of sleeping on its sockets.
    pub fn tx_pending(&self) -> bool {
        !self.s_frames.is_empty()
            || self.s_nops > 0
            || self
                .s_grants
                .get(&self.s_next_group)
                .is_some_and(|g| self.s_transfers.contains_key(&g.transfer))
    }

    /// Data frames built to be sent so far (data and NOPs; they go to the kernel in
    /// order, as its TX ring takes them): a caller that polls again for
    /// [`Endpoint::tx_pending`] compares it to see whether sending moves.
    pub fn tx_frames(&self) -> u64 {
        self.stats.data_frames_sent + self.stats.nops_sent
    }

    /// The command queue.
    pub fn cmd(&self) -> &C {
        &self.cmd
    }

    /// Sleep until a data frame arrives or `timeout` passed (a caller that expects data,
    /// e.g. a read's reply, and does not busy-poll).
    pub fn wait_data(&mut self, timeout: std::time::Duration) -> std::io::Result<bool> {
        match self.data.as_mut() {
            Some(d) => d.wait(timeout),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                L2Error::DataSocketGone,
            )),
        }
    }

    /// Sleep until a command-queue frame arrives or `timeout` passed (a caller that
    /// expects a command, a grant or an acknowledgement, and does not busy-poll).
    pub fn wait_command(&mut self, timeout: std::time::Duration) -> std::io::Result<bool> {
        self.cmd.wait(timeout)
    }

    /// Queue a command for the peer.
    pub fn send_command(&mut self, bytes: &[u8]) -> Result<(), L2Error> {
        if bytes.is_empty() || bytes.len() > MAX_COMMAND {
            return Err(L2Error::CommandSize(bytes.len()));
        }
        if self.c_queue.len() >= MAX_QUEUED_COMMANDS {
            return Err(L2Error::Busy);
        }
        self.c_queue.push_back(bytes.to_vec());
        Ok(())
    }

    /// Queue several commands one right after the other (the parts of one message), or
    /// none of them: every size and the room in the queue are checked first. Taken by
    /// value: the parts are queued as they are, not copied.
    pub fn send_commands(&mut self, parts: Vec<Vec<u8>>) -> Result<(), L2Error> {
        if let Some(p) = parts.iter().find(|p| p.is_empty() || p.len() > MAX_COMMAND) {
            return Err(L2Error::CommandSize(p.len()));
        }
        if self.c_queue.len() + parts.len() > MAX_QUEUED_COMMANDS {
            return Err(L2Error::Busy);
        }
        self.c_queue.extend(parts);
        Ok(())
    }

    /// Keep a protocol event for [`Endpoint::debug_state`].
    fn note(&mut self, what: &'static str, a: u32, b: u32) {
        if self.trace.len() >= TRACE_LEN {
            self.trace.pop_front();
        }
        self.trace.push_back((self.now, what, a, b));
    }

    /// Queue a control record (unreliable: beyond [`MAX_QUEUED_RECORDS`] it is dropped
    /// and counted, as if lost).
    fn ctl(&mut self, r: Rec) {
        if self.ctl_out.len() >= MAX_QUEUED_RECORDS {
            self.stats.records_dropped += 1;
            return;
        }
        self.ctl_out.push(r);
    }

    /// Give up receiving transfer `id` (e.g. the peer answered the read with an error,
    /// so no data will come): it will not be committed and no [`Event::Aborted`] is
    /// reported; its memory is the caller's again at [`Event::SlotsFree`] (at once
    /// when none of its groups is posted, else when the sender has filled them: it is
    /// told, and fills the groups it was granted with NOPs without waiting, so the
    /// transfers posted after it go on without a drain). Returns whether `id` was a
    /// transfer being received.
    pub fn cancel(&mut self, id: u32) -> bool {
        match self.r_transfers.get_mut(&id) {
            Some(t) if t.state == RxState::Active => {
                t.state = RxState::Aborted;
                self.stats.cancelled += 1;
                self.r_pending.retain(|(x, _)| *x != id);
                self.ctl(Rec::Unknown(id));
                true
            }
            _ => false,
        }
    }

    fn live_rx_extents(&self) -> impl Iterator<Item = &Extent> {
        self.r_transfers.values().flat_map(|t| t.extents.iter())
    }

    /// Receive a transfer into `extents` of the data region, in this order; returns its
    /// id, which the peer's [`Endpoint::send`] needs with the same extent sizes.
    pub fn expect(&mut self, extents: &[Extent]) -> Result<u32, L2Error> {
        if extents.is_empty() || extents.len() > MAX_TRANSFER_EXTENTS {
            return Err(L2Error::Extents(extents.len()));
        }
        if self.r_transfers.len() >= MAX_ACTIVE_TRANSFERS {
            return Err(L2Error::TooManyTransfers);
        }
        let size = self.sock()?.region().len();
        let (soff, sn) = self.cfg.tx_scratch;
        let scratch = (soff, soff + sn as u64 * CMD_CHUNK);
        for (i, e) in extents.iter().enumerate() {
            e.check_receivable(size)?;
            let frames = layout::frames(e.blocks);
            if frames > self.cfg.credit_frames {
                return Err(L2Error::ExceedsCredit {
                    frames,
                    credit: self.cfg.credit_frames,
                });
            }
            let (lo, hi) = e.touched();
            if lo < scratch.1 && scratch.0 < hi
                || extents[..i].iter().any(|o| layout::overlaps(o, e))
                || self.live_rx_extents().any(|o| layout::overlaps(o, e))
            {
                return Err(L2Error::InUse(e.offset));
            }
        }
        let id = self.r_next_id;
        self.r_next_id = self.r_next_id.wrapping_add(1).max(1);
        self.r_transfers.insert(
            id,
            RxXfer {
                extents: extents.to_vec(),
                first_block: first_blocks(extents),
                verified: vec![false; extents.len()],
                nverified: 0,
                // Stamped by the next poll: `self.now` is the last poll's time, which
                // may be long past if the caller did not poll while idle.
                last_progress: UNSTAMPED,
                state: RxState::Active,
                parked: false,
                ready: false,
            },
        );
        self.unstamped = true;
        self.r_pending
            .extend((0..extents.len() as u32).map(|e| (id, e)));
        Ok(id)
    }

    /// Send the peer's transfer `id` from `extents` of the data region (as many blocks
    /// per extent as the peer expects).
    pub fn send(&mut self, id: u32, extents: &[Extent]) -> Result<(), L2Error> {
        if extents.is_empty() || extents.len() > MAX_TRANSFER_EXTENTS {
            return Err(L2Error::Extents(extents.len()));
        }
        if self.s_transfers.contains_key(&id) {
            return Err(L2Error::DuplicateTransfer(id));
        }
        if self.s_transfers.len() >= MAX_ACTIVE_TRANSFERS {
            return Err(L2Error::TooManyTransfers);
        }
        for e in extents {
            e.check_sendable(self.sock()?.region().len())?;
        }
        self.s_transfers.insert(
            id,
            TxXfer {
                extents: extents.to_vec(),
                first_block: first_blocks(extents),
                last_heard: UNSTAMPED,
            },
        );
        self.unstamped = true;
        self.s_missing.remove(&id);
        self.s_gone.remove(id);
        if self.s_skipped.remove(id) {
            // We filled a group of it with NOPs; the receiver waits for this to post
            // its extents again.
            self.ctl(Rec::Ready(id));
        }
        Ok(())
    }

    /// A new session on the same sockets with another peer (a server's interface taken
    /// over by the next client): [`Endpoint::rekey`] with the new peer's MAC, so frames
    /// are sent to it and only its frames are accepted.
    pub fn rekey_peer(&mut self, session_key: &[u8], peer_mac: [u8; 6], open_tags: bool) {
        self.cfg.open_tags = open_tags;
        self.cfg.peer_mac = peer_mac;
        self.out_macs.dst = peer_mac;
        self.in_macs.src = peer_mac;
        self.rekey(session_key);
    }

    /// A new session on the same sockets (the peer restarted): everything of the old
    /// session is aborted or failed, and before anything is posted again the entries
    /// the old session left posted are drained.
    pub fn rekey(&mut self, session_key: &[u8]) {
        self.key = TagKey::derive_for(session_key, self.cfg.open_tags);
        self.c_next_seq = 0;
        self.c_unacked.clear();
        self.c_queue.clear();
        self.c_expected = 0;
        self.c_need_ack = false;
        self.c_owed_since = None;
        self.ctl_out.clear();
        let ids: Vec<u32> = self.r_transfers.keys().copied().collect();
        for id in ids {
            self.abort(id);
        }
        self.r_recent.clear();
        self.r_recent_set.clear();
        self.start_drain(None);
        for id in self.s_transfers.keys() {
            self.events.push(Event::Failed(*id));
        }
        self.s_transfers.clear();
        self.s_epoch = 0;
        self.s_next_group = 0;
        self.s_grants.clear();
        self.s_nops = 0;
        self.s_drain_done = None;
        self.s_drained_owed = false;
        self.s_missing.clear();
        self.s_skipped.clear();
        self.s_gone.clear();
        self.free_unsent();
        self.release_check();
    }

    /// Do everything due at time `now` (nanoseconds, monotonic) and return what happened.
    pub fn poll(&mut self, now: u64) -> Result<Vec<Event>, L2Error> {
        if self.polled {
            let gap = now.saturating_sub(self.now);
            self.stats.max_poll_gap_ns = self.stats.max_poll_gap_ns.max(gap);
        }
        self.polled = true;
        self.now = now;
        if std::mem::take(&mut self.unstamped) {
            for t in self.r_transfers.values_mut() {
                if t.last_progress == UNSTAMPED {
                    t.last_progress = now;
                }
            }
            for t in self.s_transfers.values_mut() {
                if t.last_heard == UNSTAMPED {
                    t.last_heard = now;
                }
            }
        }
        self.cmd_rx()?;
        self.data_rx()?;
        self.rx_timers()?;
        self.tx_timers();
        self.tx_pump()?;
        self.cmd_pump()?;
        Ok(std::mem::take(&mut self.events))
    }

    // ---- commands and control records ----

    fn cmd_rx(&mut self) -> Result<(), L2Error> {
        let mut descs = Vec::new();
        self.cmd.recv(&mut descs, CMD_RX_CHUNKS as usize);
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        for d in descs {
            let chunk = d.addr.wrapping_sub(XDP_PACKET_HEADROOM);
            let ours = d.addr >= XDP_PACKET_HEADROOM
                && chunk % CMD_CHUNK == 0
                && chunk < CMD_RX_CHUNKS as u64 * CMD_CHUNK;
            if !ours {
                // Not a descriptor we posted: nothing to read or post again.
                self.stats.refused += 1;
                continue;
            }
            // The chunk is ours whatever landed in it: post it again first, so no frame
            // (an oversized one from a neighbour included) uses up a receive chunk.
            let oversized = d.len as usize > MAX_FRAME_LEN;
            let f = &mut buf[..(d.len as usize).min(MAX_FRAME_LEN)];
            if !oversized {
                self.cmd.region().read(d.addr, f)?;
            }
            let took = self.cmd.fill(&[chunk]);
            debug_assert_eq!(took, 1, "a consumed chunk always fits back");
            if oversized {
                self.stats.refused += 1;
                continue;
            }
            match frame::decode(f, self.in_macs, &self.key) {
                Err(_) => self.stats.refused += 1,
                Ok((Body::Command { seq, ack, len }, payload)) => {
                    self.on_ack(ack);
                    if len > 0 {
                        self.c_need_ack = true;
                        if seq == self.c_expected {
                            self.c_expected = self.c_expected.wrapping_add(1);
                            self.stats.commands_received += 1;
                            self.events.push(Event::Command(payload.to_vec()));
                        } else {
                            self.stats.command_duplicates += 1;
                        }
                    }
                }
                Ok((Body::Control { .. }, payload)) => {
                    if payload.len() % RECORD_LEN != 0 {
                        self.stats.refused += 1;
                        continue;
                    }
                    let recs: Vec<Rec> =
                        payload.chunks(RECORD_LEN).filter_map(Rec::decode).collect();
                    for r in recs {
                        self.on_record(r);
                    }
                }
                Ok(_) => self.stats.refused += 1,
            }
        }
        Ok(())
    }

    fn on_ack(&mut self, ack: u32) {
        // Ignore an ack of something never sent.
        if (ack.wrapping_sub(self.c_next_seq) as i32) > 0 {
            return;
        }
        let mut popped = false;
        while let Some((seq, _)) = self.c_unacked.front() {
            if (seq.wrapping_sub(ack) as i32) < 0 {
                self.c_unacked.pop_front();
                popped = true;
            } else {
                break;
            }
        }
        if popped {
            self.c_sent_at = self.now;
        }
    }

    /// Write one command-queue frame into a free TX chunk and add it to `batch`; false
    /// when no chunk is free.
    fn stage_cmd_frame(
        &mut self,
        batch: &mut Vec<Desc>,
        body: Body,
        payload: &[u8],
    ) -> Result<bool, L2Error> {
        let Some(chunk) = self.c_tx_free.pop() else {
            return Ok(false);
        };
        let f = frame::build(self.out_macs, &body, payload, &self.key);
        if let Err(e) = self.cmd.region().write(chunk, &f) {
            self.c_tx_free.push(chunk);
            return Err(e.into());
        }
        batch.push(Desc {
            addr: chunk,
            len: f.len() as u32,
        });
        Ok(true)
    }

    /// How long a bare acknowledgement or a DONE record may wait for a frame to ride
    /// with (see [`ACK_DELAY_RTO_DIVISOR`]).
    fn ack_delay(&self) -> u64 {
        self.cfg.rto_ns / ACK_DELAY_RTO_DIVISOR
    }

    /// Whether a bare acknowledgement or a DONE record waits to be sent.
    fn owes_lazy(&self) -> bool {
        self.c_need_ack || self.ctl_out.iter().any(|r| matches!(r, Rec::Done(_)))
    }

    /// When the deferred acknowledgement and DONE records are due (nanoseconds, on the
    /// clock of [`Endpoint::poll`]): a caller that stops polling once it has its answer
    /// polls again by then (or sooner), else the peer retransmits after its RTO. None:
    /// nothing is deferred.
    pub fn deferred_due(&self) -> Option<u64> {
        self.c_owed_since
            .map(|t| t.saturating_add(self.ack_delay()))
    }

    /// Send what the command queue owes, as ONE batch (one kick of the kernel: in copy
    /// mode every kick runs the peer's receive path inside the call, so each costs a
    /// few microseconds on the critical path): control records (grants before the
    /// commands they serve), new and retransmitted commands (each carries the
    /// cumulative ack), and a bare ack if no command carried it.
    ///
    /// Bare acks and DONE records are *lazy*: they wait up to [`Endpoint::deferred_due`]
    /// for a frame that goes anyway (the next request, a grant), so a request and its
    /// reply cost one frame each way rather than three. A frame the kernel does not
    /// take is as if lost: a command is retransmitted after the RTO, a record recovered
    /// by the timers.
    fn cmd_pump(&mut self) -> Result<(), L2Error> {
        let mut done = Vec::new();
        self.cmd.completions(&mut done, usize::MAX);
        self.c_tx_free.extend(done);
        let mut batch: Vec<Desc> = Vec::new();
        let mut commands_in_batch = false;

        // Which commands go: the window again (go-back-N) when its oldest waited an
        // RTO, then new ones while the window has room.
        let retransmit = !self.c_unacked.is_empty()
            && self.now.saturating_sub(self.c_sent_at) >= self.cfg.rto_ns;
        let new_room = CMD_WINDOW.saturating_sub(self.c_unacked.len());
        let sends_commands = retransmit || (new_room > 0 && !self.c_queue.is_empty());
        let urgent = self.ctl_out.iter().any(|r| !matches!(r, Rec::Done(_)));
        let lazy_due = self.deferred_due().is_some_and(|due| self.now >= due);
        let flush_lazy = lazy_due || urgent || sends_commands;

        // Control records first: a grant must be at the peer when the request it serves
        // is. All of them go when the batch goes anyway or the lazy ones are due.
        if flush_lazy {
            let per_frame = crate::MAX_PAYLOAD / RECORD_LEN;
            let out = std::mem::take(&mut self.ctl_out);
            let mut at = 0;
            while at < out.len() {
                let n = per_frame.min(out.len() - at);
                let mut p = Vec::with_capacity(n * RECORD_LEN);
                for r in &out[at..at + n] {
                    r.encode(&mut p);
                }
                let body = Body::Control {
                    len: p.len() as u32,
                };
                if !self.stage_cmd_frame(&mut batch, body, &p)? {
                    break;
                }
                at += n;
            }
            // Records without a chunk wait for the next pump, in order.
            self.ctl_out = out[at..].to_vec();
        }

        if retransmit {
            let resend: Vec<(u32, Vec<u8>)> = self.c_unacked.iter().cloned().collect();
            for (seq, m) in resend {
                let body = Body::Command {
                    seq,
                    ack: self.c_expected,
                    len: m.len() as u32,
                };
                if !self.stage_cmd_frame(&mut batch, body, &m)? {
                    break;
                }
                commands_in_batch = true;
                self.stats.command_retransmits += 1;
            }
            self.c_sent_at = self.now;
        }
        while self.c_unacked.len() < CMD_WINDOW {
            let Some(m) = self.c_queue.pop_front() else {
                break;
            };
            let seq = self.c_next_seq;
            let body = Body::Command {
                seq,
                ack: self.c_expected,
                len: m.len() as u32,
            };
            if !self.stage_cmd_frame(&mut batch, body, &m)? {
                self.c_queue.push_front(m);
                break;
            }
            commands_in_batch = true;
            self.stats.commands_sent += 1;
            if self.c_unacked.is_empty() {
                self.c_sent_at = self.now;
            }
            self.c_next_seq = seq.wrapping_add(1);
            self.c_unacked.push_back((seq, m));
        }
        if commands_in_batch {
            self.c_need_ack = false;
        } else if self.c_need_ack && flush_lazy {
            let body = Body::Command {
                seq: self.c_next_seq,
                ack: self.c_expected,
                len: 0,
            };
            if self.stage_cmd_frame(&mut batch, body, &[])? {
                self.c_need_ack = false;
            }
        }

        if !batch.is_empty() {
            let took = self.cmd.transmit(&batch);
            // Not taken: as if lost (see above); the chunks are free again.
            self.c_tx_free.extend(batch[took..].iter().map(|d| d.addr));
            self.stats.command_kicks += 1;
        }
        if !self.owes_lazy() {
            self.c_owed_since = None;
        } else if self.c_owed_since.is_none() {
            self.c_owed_since = Some(self.now);
        }
        Ok(())
    }

    fn on_record(&mut self, r: Rec) {
        match r {
            // To our sender side.
            Rec::Grant {
                epoch,
                group,
                transfer,
                extent,
                blocks,
            } => {
                if epoch != self.s_epoch
                    || (group.wrapping_sub(self.s_next_group) as i32) < 0
                    || self.s_grants.len() >= MAX_CREDIT_FRAMES
                {
                    self.stats.stale_grants += 1;
                    return;
                }
                if let Some(t) = self.s_transfers.get_mut(&transfer) {
                    t.last_heard = self.now;
                }
                self.s_grants.insert(
                    group,
                    Grant {
                        transfer,
                        extent,
                        blocks,
                    },
                );
            }
            Rec::Drain {
                epoch,
                first_group,
                id,
                nops,
            } => {
                // Epochs and drain ids wrap: newer is ahead by less than half the range.
                let ahead = |a: u32, b: u32| (a.wrapping_sub(b) as i32) > 0;
                let newer = match self.s_drain_done {
                    None => true,
                    Some((e, i)) => ahead(epoch, e) || (epoch == e && ahead(id, i)),
                };
                if newer {
                    self.note("sender: DRAIN (epoch, nops)", epoch, nops);
                    self.s_epoch = epoch;
                    self.s_next_group = first_group;
                    self.s_grants.clear();
                    self.free_unsent();
                    self.s_nops = self.s_nops.saturating_add(nops).min(MAX_DRAIN_NOPS);
                    self.s_drain_done = Some((epoch, id));
                    self.s_drained_owed = true;
                } else if Some((epoch, id)) == self.s_drain_done {
                    self.s_drained_owed = true;
                }
            }
            Rec::Done(t) => {
                if self.s_transfers.remove(&t).is_some() {
                    self.events.push(Event::Delivered(t));
                }
            }
            Rec::Unknown(t) => {
                if self.s_transfers.remove(&t).is_some() {
                    self.events.push(Event::Failed(t));
                }
                // The receiver gave it up: a group of it still granted is filled with
                // NOPs at once.
                self.s_missing.remove(&t);
                self.s_skipped.remove(t);
                self.s_gone.insert(t);
            }
            Rec::Ready(t) => self.sender_has(t),
            // To our receiver side.
            Rec::Drained { epoch, id } => {
                if let Some(d) = &mut self.r_drain {
                    if d.id == id && epoch == self.r_epoch && d.acked.is_none() {
                        d.acked = Some(self.now);
                        let left = self.r_unconsumed as u32;
                        self.note("DRAINED in (id, unconsumed)", id, left);
                    }
                }
            }
            Rec::Status(t) => {
                // The sender asks, so it has the transfer (a lost READY).
                self.sender_has(t);
                let active =
                    matches!(self.r_transfers.get(&t), Some(x) if x.state == RxState::Active);
                if self.r_recent_set.contains(&t) {
                    self.ctl(Rec::Done(t));
                } else if !active {
                    self.ctl(Rec::Unknown(t));
                }
            }
        }
    }

    // ---- receiving data ----

    fn data_rx(&mut self) -> Result<(), L2Error> {
        let mut descs = Vec::new();
        self.sock_mut()?.recv(&mut descs, RX_BATCH);
        for d in descs {
            self.r_last_rx = self.now;
            let Some(g) = self.r_posted.front_mut() else {
                // The kernel only fills what we posted; count it and go on.
                self.stats.groups_failed += 1;
                self.stats.stale_frames += 1;
                continue;
            };
            if g.stale {
                self.stats.stale_frames += 1;
            }
            let p = g.plan[g.consumed];
            let at_plan = d.addr == p.fill + XDP_PACKET_HEADROOM;
            if !at_plan || d.len != p.len {
                g.ok = false;
            }
            if at_plan && d.len as usize == NOP_FRAME_LEN {
                g.nops += 1;
            }
            g.consumed += 1;
            self.r_unconsumed -= 1;
            if g.consumed == g.plan.len() {
                let g = self.r_posted.pop_front().expect("front");
                self.evaluate(g)?;
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, g: Posted) -> Result<(), L2Error> {
        let live = !g.stale
            && matches!(self.r_transfers.get(&g.transfer), Some(t) if t.state == RxState::Active);
        if !live {
            self.release_check();
            return Ok(());
        }
        let t = &self.r_transfers[&g.transfer];
        let ext = t.extents[g.extent as usize];
        let first = t.first_block[g.extent as usize];
        if !g.ok && g.nops == g.plan.len() && self.is_skip(&g)? {
            // The sender filled the group with NOPs: it does not have the transfer (yet).
            // The groups after it are in step; the extent waits for READY.
            self.stats.skips_received += 1;
            self.note("skip received (group, transfer)", g.group, g.transfer);
            let t = self.r_transfers.get_mut(&g.transfer).expect("live");
            if t.ready {
                self.r_pending.push_back((g.transfer, g.extent));
            } else {
                t.parked = true;
                self.r_pending.retain(|(x, _)| *x != g.transfer);
            }
            return Ok(());
        }
        let ok = g.ok && self.check_front(&g, &ext, first)?;
        if !ok {
            self.stats.groups_failed += 1;
            self.start_drain(Some(g));
            return Ok(());
        }
        self.stats.extents_verified += 1;
        let t = self.r_transfers.get_mut(&g.transfer).expect("live");
        if !t.verified[g.extent as usize] {
            t.verified[g.extent as usize] = true;
            t.nverified += 1;
        }
        t.last_progress = self.now;
        if t.nverified == t.extents.len() {
            self.r_transfers.remove(&g.transfer);
            self.stats.committed += 1;
            self.events.push(Event::Committed(g.transfer));
            self.ctl(Rec::Done(g.transfer));
            self.r_recent.push_back(g.transfer);
            self.r_recent_set.insert(g.transfer);
            if self.r_recent.len() > RECENT_DONE {
                let old = self.r_recent.pop_front().expect("nonempty");
                self.r_recent_set.remove(&old);
            }
        }
        Ok(())
    }

    /// Whether every descriptor of the group is a NOP of the sender's skip of this group.
    fn is_skip(&self, g: &Posted) -> Result<bool, L2Error> {
        let want = Body::Nop {
            epoch: g.epoch,
            group: g.group,
            transfer: g.transfer,
        };
        let mut f = [0u8; NOP_FRAME_LEN];
        for p in &g.plan {
            self.sock()?
                .region()
                .read(p.fill + XDP_PACKET_HEADROOM, &mut f)?;
            match frame::decode(&f, self.in_macs, &self.key) {
                Ok((body, _)) if body == want => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Receiver: the sender has transfer `t` now (READY, or it asks STATUS): a parked
    /// transfer's extents that are neither verified, pending nor posted go back to be
    /// posted.
    fn sender_has(&mut self, t: u32) {
        let Some(x) = self.r_transfers.get_mut(&t) else {
            return;
        };
        if x.state != RxState::Active {
            return;
        }
        x.ready = true;
        if !x.parked {
            return;
        }
        x.parked = false;
        let busy: HashSet<u32> = self
            .r_pending
            .iter()
            .filter(|(id, _)| *id == t)
            .map(|(_, e)| *e)
            .chain(
                self.r_posted
                    .iter()
                    .filter(|g| g.transfer == t && !g.stale)
                    .map(|g| g.extent),
            )
            .collect();
        let x = &self.r_transfers[&t];
        let back: Vec<(u32, u32)> = (0..x.extents.len() as u32)
            .filter(|e| !x.verified[*e as usize] && !busy.contains(e))
            .map(|e| (t, e))
            .collect();
        self.r_pending.extend(back);
    }

    /// The surviving header in front of the extent and the extent's CRC.
    fn check_front(&self, g: &Posted, ext: &Extent, first: u32) -> Result<bool, L2Error> {
        let mut h = [0u8; HEADER_LEN];
        self.sock()?
            .region()
            .read(ext.offset - HEADER_LEN as u64, &mut h)?;
        let Ok((
            Body::Data {
                seg,
                epoch,
                group,
                transfer,
                block,
                crc,
            },
            _,
        )) = frame::decode(&h, self.in_macs, &self.key)
        else {
            return Ok(false);
        };
        if (seg, epoch, group, transfer, block) != (0, g.epoch, g.group, g.transfer, first) {
            return Ok(false);
        }
        Ok(self
            .sock()?
            .region()
            .crc32c(ext.offset, ext.bytes() as usize)?
            == crc)
    }

    fn start_drain(&mut self, failed: Option<Posted>) {
        let mut back = Vec::new();
        match &failed {
            Some(g) => self.note("drain: group failed (group, transfer)", g.group, g.transfer),
            None => self.note(
                "drain: stalled or rekeyed (unconsumed, posted groups)",
                self.r_unconsumed as u32,
                self.r_posted.len() as u32,
            ),
        }
        if let Some(g) = failed {
            back.push((g.transfer, g.extent));
        }
        for g in self.r_posted.iter_mut() {
            if !g.stale {
                g.stale = true;
                back.push((g.transfer, g.extent));
            }
        }
        // Only live transfers' extents go back (not the aborted, cancelled or parked:
        // they would only hold up the others again).
        back.retain(|(id, _)| {
            matches!(self.r_transfers.get(id), Some(t) if t.state == RxState::Active && !t.parked)
        });
        for x in back.into_iter().rev() {
            self.r_pending.push_front(x);
        }
        self.r_epoch = self.r_epoch.wrapping_add(1);
        self.r_drain_id = self.r_drain_id.wrapping_add(1);
        self.r_drain = Some(Drain {
            id: self.r_drain_id,
            issued: self.now,
            acked: None,
        });
        self.stats.drains += 1;
        self.push_drain();
    }

    fn push_drain(&mut self) {
        if let Some(d) = &self.r_drain {
            self.ctl(Rec::Drain {
                epoch: self.r_epoch,
                first_group: self.r_next_group,
                id: d.id,
                nops: self.r_unconsumed as u32,
            });
        }
    }

    fn abort(&mut self, id: u32) {
        if let Some(t) = self.r_transfers.get_mut(&id) {
            if t.state == RxState::Active {
                t.state = RxState::Aborted;
                self.stats.aborted += 1;
                self.events.push(Event::Aborted(id));
                self.note("aborted (transfer, 0)", id, 0);
                self.r_pending.retain(|(x, _)| *x != id);
            }
        }
    }

    /// Hand back aborted transfers no posted entry points into.
    fn release_check(&mut self) {
        let posted: HashSet<u32> = self.r_posted.iter().map(|g| g.transfer).collect();
        let free: Vec<u32> = self
            .r_transfers
            .iter()
            .filter(|(id, t)| t.state == RxState::Aborted && !posted.contains(id))
            .map(|(id, _)| *id)
            .collect();
        for id in free {
            self.r_transfers.remove(&id);
            self.events.push(Event::SlotsFree(id));
        }
    }

    fn rx_timers(&mut self) -> Result<(), L2Error> {
        let now = self.now;
        let expired: Vec<u32> = self
            .r_transfers
            .iter()
            .filter(|(_, t)| {
                t.state == RxState::Active
                    && now.saturating_sub(t.last_progress) >= self.cfg.transfer_timeout_ns
            })
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.abort(id);
        }
        self.release_check();
        let mut quiet = false;
        if let Some(d) = &mut self.r_drain {
            // Once DRAINED is in, the quiet time and the re-ask are separate clocks: with
            // every entry consumed the drain only waits for the quiet time (however long,
            // it is never cut short by a re-ask); with entries left (NOPs lost) it asks
            // again an RTO after the answer or the last frame.
            match d.acked {
                Some(at) if self.r_unconsumed == 0 => {
                    // Not a guard: a drain not yet quiet must not fall to the re-ask.
                    quiet = now >= at.max(self.r_last_rx).saturating_add(self.cfg.quiet_ns);
                }
                Some(at) if now.saturating_sub(at.max(self.r_last_rx)) >= self.cfg.rto_ns => {
                    // The NOPs came short (lost): ask for the rest.
                    self.r_drain_id = self.r_drain_id.wrapping_add(1);
                    d.id = self.r_drain_id;
                    d.acked = None;
                    d.issued = now;
                    self.stats.drain_reasks += 1;
                    self.note(
                        "drain: NOPs short, ask again (unconsumed, id)",
                        self.r_unconsumed as u32,
                        self.r_drain_id,
                    );
                    self.push_drain();
                }
                None if now.saturating_sub(d.issued) >= self.cfg.rto_ns => {
                    d.issued = now;
                    let id = d.id;
                    self.stats.drain_reasks += 1;
                    self.note(
                        "drain: no DRAINED, ask again (unconsumed, id)",
                        self.r_unconsumed as u32,
                        id,
                    );
                    self.push_drain();
                }
                _ => {}
            }
            if quiet {
                self.r_drain = None;
                self.note(
                    "drain over: post again (epoch, pending extents)",
                    self.r_epoch,
                    self.r_pending.len() as u32,
                );
            }
            if self.r_drain.is_some() {
                return Ok(());
            }
        } else if self.r_unconsumed > 0
            && now.saturating_sub(self.r_last_rx.max(self.r_last_post)) >= self.cfg.rto_ns
        {
            // Posted entries and nothing arriving: a loss at the end, or a lost grant.
            self.stats.drains_stalled += 1;
            self.start_drain(None);
            return Ok(());
        }
        self.post()
    }

    fn post(&mut self) -> Result<(), L2Error> {
        while let Some(&(id, e)) = self.r_pending.front() {
            let Some(t) = self
                .r_transfers
                .get(&id)
                .filter(|t| t.state == RxState::Active && !t.parked)
            else {
                self.r_pending.pop_front();
                continue;
            };
            if t.verified[e as usize] {
                self.r_pending.pop_front();
                continue;
            }
            let ext = t.extents[e as usize];
            let plan = layout::fill_plan(&ext);
            let n = plan.len();
            if self.r_unconsumed + n > self.cfg.credit_frames || self.sock()?.fill_free() < n {
                break;
            }
            let fills: Vec<u64> = plan.iter().map(|p| p.fill).collect();
            let took = self.sock_mut()?.fill(&fills);
            if took != n {
                return Err(L2Error::FillRing { took, asked: n });
            }
            self.r_pending.pop_front();
            let group = self.r_next_group;
            self.r_next_group = group.wrapping_add(1);
            self.r_unconsumed += n;
            self.r_last_post = self.now;
            self.ctl(Rec::Grant {
                epoch: self.r_epoch,
                group,
                transfer: id,
                extent: e,
                blocks: ext.blocks as u16,
            });
            self.r_posted.push_back(Posted {
                group,
                epoch: self.r_epoch,
                transfer: id,
                extent: e,
                plan,
                consumed: 0,
                ok: true,
                nops: 0,
                stale: false,
            });
        }
        Ok(())
    }

    // ---- sending data ----

    fn free_unsent(&mut self) {
        let unsent: Vec<u64> = self.s_frames.drain(..).map(|d| d.addr).collect();
        self.s_free.extend(unsent);
    }

    fn tx_timers(&mut self) {
        let now = self.now;
        let rto = self.cfg.rto_ns;
        let failed: Vec<u32> = self
            .s_transfers
            .iter()
            .filter(|(_, t)| now.saturating_sub(t.last_heard) >= self.cfg.transfer_timeout_ns)
            .map(|(id, _)| *id)
            .collect();
        for id in failed {
            self.s_transfers.remove(&id);
            self.events.push(Event::Failed(id));
        }
        let timeout = self.cfg.transfer_timeout_ns;
        self.s_missing
            .retain(|_, since| now.saturating_sub(*since) < timeout);
        if self.s_missing.len() > MAX_SENDER_MEMORY {
            // Only the head grant adds one per hold time; a peer granting garbage could
            // add more: forget them (they are re-learnt at the head).
            self.s_missing.clear();
        }
        if now.saturating_sub(self.s_last_status) >= rto {
            self.s_last_status = now;
            let ask: Vec<u32> = self
                .s_transfers
                .iter()
                .filter(|(_, t)| now.saturating_sub(t.last_heard) >= rto)
                .map(|(id, _)| *id)
                .collect();
            for t in ask {
                self.ctl(Rec::Status(t));
            }
        }
    }

    fn tx_pump(&mut self) -> Result<(), L2Error> {
        let mut done = Vec::new();
        self.sock_mut()?.completions(&mut done, usize::MAX);
        self.s_free.extend(done);
        loop {
            if !self.s_frames.is_empty() {
                let batch: Vec<Desc> = self.s_frames.iter().copied().collect();
                let n = self.sock_mut()?.transmit(&batch);
                self.s_frames.drain(..n);
                if !self.s_frames.is_empty() {
                    return Ok(());
                }
                continue;
            }
            if self.s_nops > 0 {
                let k = (self.s_nops as usize).min(self.s_free.len());
                if k == 0 {
                    return Ok(());
                }
                let mut h = [0u8; HEADER_LEN];
                frame::encode(
                    &mut h,
                    self.out_macs,
                    &Body::Nop {
                        epoch: self.s_epoch,
                        group: 0,
                        transfer: 0,
                    },
                    &[],
                    &self.key,
                );
                let mut f = h.to_vec();
                f.resize(NOP_FRAME_LEN, 0);
                for _ in 0..k {
                    let chunk = self.s_free.pop().expect("counted");
                    self.sock()?.region().write(chunk, &f)?;
                    self.s_frames.push_back(Desc {
                        addr: chunk,
                        len: NOP_FRAME_LEN as u32,
                    });
                }
                self.s_nops -= k as u32;
                self.stats.nops_sent += k as u64;
                continue;
            }
            if self.s_drained_owed {
                // DRAINED tells the receiver that nothing of ours is on the way any more:
                // sent only when every frame given to the kernel has completed (left the
                // TX ring and was placed or dropped at the peer). Frames still in the TX
                // ring (copy mode sends at most 32 per kick) would otherwise land after
                // the receiver posted again, fail its first group and start the next
                // drain, round after round (issue 12: a transfer stalled for the timeout).
                if self.s_free.len() < self.cfg.tx_scratch.1 as usize {
                    self.stats.drained_held += 1;
                    return Ok(());
                }
                self.s_drained_owed = false;
                let (epoch, id) = self.s_drain_done.expect("owed after a drain");
                self.ctl(Rec::Drained { epoch, id });
                continue;
            }
            let Some(&g) = self.s_grants.get(&self.s_next_group) else {
                return Ok(());
            };
            let Some(t) = self.s_transfers.get(&g.transfer) else {
                // Not (yet) told to send it (a read's groups are posted before the
                // request goes): wait a while for it, then fill the group with NOPs so
                // the groups granted after it go on. At once when the receiver gave it up.
                let since = *self.s_missing.entry(g.transfer).or_insert(self.now);
                let gone = self.s_gone.contains(g.transfer);
                let hold = self.cfg.rto_ns / SKIP_HOLD_RTO_DIVISOR;
                if !gone && self.now.saturating_sub(since) < hold {
                    return Ok(());
                }
                if g.blocks == 0 || g.blocks as u32 > crate::MAX_EXTENT_BLOCKS {
                    // A grant no extent can have: drop it; the receiver drains.
                    self.s_grants.remove(&self.s_next_group);
                    return Ok(());
                }
                let n = layout::frames(g.blocks as u32);
                if self.s_free.len() < n {
                    return Ok(());
                }
                let mut h = [0u8; HEADER_LEN];
                frame::encode(
                    &mut h,
                    self.out_macs,
                    &Body::Nop {
                        epoch: self.s_epoch,
                        group: self.s_next_group,
                        transfer: g.transfer,
                    },
                    &[],
                    &self.key,
                );
                let mut f = h.to_vec();
                f.resize(NOP_FRAME_LEN, 0);
                for _ in 0..n {
                    let chunk = self.s_free.pop().expect("counted");
                    self.sock()?.region().write(chunk, &f)?;
                    self.s_frames.push_back(Desc {
                        addr: chunk,
                        len: NOP_FRAME_LEN as u32,
                    });
                }
                if !gone {
                    self.s_skipped.insert(g.transfer);
                }
                self.stats.groups_skipped += 1;
                self.note(
                    "sender: skipped (group, transfer)",
                    self.s_next_group,
                    g.transfer,
                );
                self.s_grants.remove(&self.s_next_group);
                self.s_next_group = self.s_next_group.wrapping_add(1);
                continue;
            };
            let e = g.extent as usize;
            if e >= t.extents.len() || t.extents[e].blocks != g.blocks as u32 {
                // The peer's plan and ours disagree: this transfer cannot succeed.
                self.s_transfers.remove(&g.transfer);
                self.s_grants.remove(&self.s_next_group);
                self.events.push(Event::Failed(g.transfer));
                return Ok(());
            }
            let src = t.extents[e];
            let segs = layout::segments(src.blocks);
            if self.s_free.len() < segs.len() {
                return Ok(());
            }
            let body_for = |seg: u16, crc: u32| Body::Data {
                seg,
                epoch: self.s_epoch,
                group: self.s_next_group,
                transfer: g.transfer,
                block: t.first_block[e],
                crc,
            };
            let crc = self
                .sock()?
                .region()
                .crc32c(src.offset, src.bytes() as usize)?;
            let mut frames = Vec::with_capacity(segs.len());
            for s in &segs {
                let chunk = self.s_free.pop().expect("counted");
                let mut h = [0u8; HEADER_LEN];
                frame::encode(
                    &mut h,
                    self.out_macs,
                    &body_for(s.index, crc),
                    &[],
                    &self.key,
                );
                let r = self.sock()?.region();
                r.write(chunk, &h)?;
                r.copy_within(
                    src.offset + s.start as u64,
                    chunk + HEADER_LEN as u64,
                    s.len as usize,
                )?;
                frames.push(Desc {
                    addr: chunk,
                    len: s.frame_len(),
                });
            }
            self.stats.data_frames_sent += frames.len() as u64;
            self.stats.groups_sent += 1;
            self.s_frames.extend(frames);
            self.s_grants.remove(&self.s_next_group);
            self.s_next_group = self.s_next_group.wrapping_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_keeps_the_last_trace_len_events() {
        use crate::sim::{Injector, SimLink};
        let (d, _) = SimLink::pair(1 << 20, 1 << 20, Injector::none(1));
        let (c, _) = SimLink::pair(CMD_REGION_LEN, CMD_REGION_LEN, Injector::none(2));
        let cfg = Config {
            local_mac: [2, 0, 0, 0, 0, 1],
            peer_mac: [2, 0, 0, 0, 0, 2],
            rto_ns: 1000,
            quiet_ns: 100,
            transfer_timeout_ns: 10_000,
            credit_frames: 64,
            tx_scratch: (0, layout::frames(crate::MAX_EXTENT_BLOCKS) as u32),
            open_tags: false,
        };
        let mut ep = Endpoint::new(cfg, b"k", d, c).unwrap();
        for i in 0..TRACE_LEN as u32 {
            ep.note("event", i, 0);
        }
        assert_eq!(ep.trace.len(), TRACE_LEN);
        ep.note("event", TRACE_LEN as u32, 0);
        assert_eq!(ep.trace.len(), TRACE_LEN, "bounded");
        assert_eq!(ep.trace.front().unwrap().2, 1, "the oldest went first");
        assert!(ep.debug_state().contains(&format!("event {TRACE_LEN} 0")));
    }

    #[test]
    fn records_round_trip() {
        let recs = [
            Rec::Grant {
                epoch: 1,
                group: 2,
                transfer: 3,
                extent: 4,
                blocks: 5,
            },
            Rec::Drain {
                epoch: 6,
                first_group: 7,
                id: 8,
                nops: 9,
            },
            Rec::Drained { epoch: 10, id: 11 },
            Rec::Done(12),
            Rec::Unknown(13),
            Rec::Status(14),
            Rec::Ready(15),
        ];
        for r in recs {
            let mut b = Vec::new();
            r.encode(&mut b);
            assert_eq!(b.len(), RECORD_LEN);
            assert_eq!(Rec::decode(&b), Some(r));
        }
        assert_eq!(Rec::decode(&[0u8; RECORD_LEN]), None);
    }
}
