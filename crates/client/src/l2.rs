//! The client's layer-2 lane (issue 12, phase 1; docs/protocol.md "The layer-2 lane"):
//! after the handshake the client offers the lane on TCP (`L2Setup`); once accepted,
//! the requests in [`rides_l2`] go as layer-2 commands and reads up to
//! [`L2Options::read_max`] get their data as a layer-2 transfer into a receive slot;
//! everything else stays on TCP. Before the lane is used it must carry one round trip
//! (a `Ping`, the set-up's probe): a lane whose frames do not reach the server (the
//! client's interface is not on the Ethernet segment of the server's `--l2` one) is
//! given up at set-up, with one log line, instead of stalling a request later.
//!
//! Waiting: the caller that waits for a reply polls the endpoint itself when no one
//! else does (leader/follower under the lane's mutex; the reply's reader is the
//! caller, no hand-off thread), spinning ([`L2Poll::Busy`], yielding the CPU to any
//! thread ready on it) or sleeping in poll(2) on the sockets ([`L2Poll::Wait`]) between
//! polls.
//!
//! A request without its reply within [`L2_REPLY_TIMEOUT`] means the layer-2 peer is
//! lost: the lane goes down (one log line), every request on it fails over to TCP
//! (sent again with the same id: the server's reply cache makes it count once) and the
//! session stays on TCP until the lane is fenced and set up again
//! ([`L2_RETRY_AFTER`]).

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use zcfs_l2::endpoint::{CMD_CHUNK, CMD_REGION_LEN};
use zcfs_l2::{Config, Endpoint, Event, Extent, SlotGeometry, BLOCK_SIZE, MAX_COMMAND};
use zcfs_protocol::l2::{
    blocks_spanned, decode_reply, encode_landing_write, encode_request, request_len, split_request,
    L2Reply, MAX_LANDING_WRITE, MAX_READ, MAX_REQUEST, MAX_WRITE,
};
use zcfs_protocol::{Op, Request, RespHeader, OP_SLOTS, REQ_HDR};
use zcfs_xsk::{bind_retrying, mac_address, BindMode, Region, XdpProgram, XskConfig, XskSocket};

use crate::{lock, Response};

/// The queue commands travel on (the server's `CMD_QUEUE`).
pub const CMD_QUEUE: u32 = 0;
/// The queue data frames travel on (the server's `DATA_QUEUE`).
pub const DATA_QUEUE: u32 = 1;
/// Receive slots: reads on the lane in flight at once.
pub const RECEIVE_SLOTS: u32 = 32;
/// Chunks of TX scratch (the endpoint needs room for its largest extent's frames).
pub const TX_CHUNKS: u32 = 128;
/// Send slots: landing writes whose data is being sent at once. Each holds the blocks
/// of the largest landing write ([`MAX_LANDING_WRITE`] bytes at any offset).
pub const SEND_SLOTS: u32 = 4;
/// Bytes of one send slot.
const SEND_SLOT_BYTES: u64 = MAX_LANDING_WRITE as u64 + BLOCK_SIZE as u64;
/// A request without its reply for this long: the layer-2 peer is lost.
pub const L2_REPLY_TIMEOUT: Duration = Duration::from_secs(1);
/// A lane lost and fenced is set up again after this long (if the server takes it).
pub const L2_RETRY_AFTER: Duration = Duration::from_secs(2);
/// A lane set up again (after one of this client's lanes had worked) that carries no
/// reply, or a lane lost with data due (a read's, a landing write's) that never brought
/// any, is tried again this many times in a row, each after [`L2_RETRY_AFTER`]; then the
/// session stays on TCP. A lane that carried only commands is not counted.
pub const L2_SILENT_RETRIES: u32 = 3;
/// The longest wait before a lane refused busy is offered again (the wait doubles from
/// [`L2_RETRY_AFTER`] with each refusal in a row).
pub const L2_BUSY_RETRY_MAX: Duration = Duration::from_secs(64);
/// A fence that failed (its connection lost: the server restarted, the link broke) is
/// asked for again by the next request after this long.
pub const FENCE_RETRY_AFTER: Duration = Duration::from_millis(100);
/// Reads up to this many bytes go over layer 2 by default (see README: measured).
pub const DEFAULT_L2_READ_MAX: u32 = 64 << 10;
/// Writes up to this many bytes go over layer 2 by default: the most a request carries,
/// since 16 KiB writes were faster on the lane than on TCP too (docs/benchmarks.md,
/// "Writes on the lane in request parts").
pub const DEFAULT_L2_WRITE_MAX: u32 = MAX_WRITE;
/// Writes above `write_max` up to this many bytes land in place by default (a
/// transfer into the server's blocks, docs/protocol.md "Landing writes"), by how the
/// lane waits: measured on veth (docs/benchmarks.md "Landing writes"), a busy-polled
/// lane landed 64 KiB to 1 MiB writes as fast as TCP or faster (1 MiB: 0.89-0.95x TCP's
/// p50); a waiting one was no faster than TCP (1 MiB 0.94-1.0x, 64 KiB 1.35x: every
/// step wakes a sleeping thread, as TCP's does), so there large writes go on TCP unless
/// `land_max` says otherwise.
pub fn default_land_max(poll: L2Poll) -> u32 {
    match poll {
        L2Poll::Busy => MAX_LANDING_WRITE,
        L2Poll::Wait => 0,
    }
}
/// Longest sleep in poll(2) between polls (wait mode).
const WAIT_SLICE: Duration = Duration::from_millis(1);
/// How long a waiting caller whose read has its reply but not yet its data, or its data
/// but not yet its reply, polls again at once (yielding) instead of sleeping: the server
/// sends the two back to back, so the rest is microseconds away; after this it sleeps.
const HALF_DONE_SPIN: Duration = Duration::from_micros(50);
/// The flusher's sleep when nothing is deferred (it is woken when something is); also
/// how long it may outlive its lane.
const FLUSHER_IDLE: Duration = Duration::from_millis(100);
/// The flusher's next look when what is due waits because a caller is polling.
const FLUSHER_RETRY: Duration = Duration::from_micros(100);
/// Retransmission timeout, quiet time and transfer timeout of the endpoint.
const RTO: Duration = Duration::from_millis(5);
const QUIET: Duration = Duration::from_millis(1);
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(2);

/// How a waiter on the lane waits for frames (shared with the other side).
pub use zcfs_l2::L2Poll;

/// The layer-2 lane's settings (`ClientConfig::l2`).
#[derive(Clone, Debug)]
pub struct L2Options {
    /// The interface on the server's Ethernet segment.
    pub iface: String,
    pub poll: L2Poll,
    /// Reads up to this many bytes go over layer 2 (at most `MAX_READ`).
    pub read_max: u32,
    /// Writes up to this many bytes go over layer 2, inline in the request's commands
    /// (at most `MAX_WRITE`).
    pub write_max: u32,
    /// Writes larger than `write_max` and up to this many bytes land in place: their
    /// data goes as a layer-2 transfer into the server's blocks (at most
    /// `MAX_LANDING_WRITE`; 0: none, they go on TCP). None: [`default_land_max`] of
    /// `poll`.
    pub land_max: Option<u32>,
}

impl L2Options {
    pub fn new(iface: &str) -> L2Options {
        L2Options {
            iface: iface.to_string(),
            poll: L2Poll::Wait,
            read_max: DEFAULT_L2_READ_MAX,
            write_max: DEFAULT_L2_WRITE_MAX,
            land_max: None,
        }
    }
}

/// Whether `req` travels on the lane: the explicit list, whose requests fit
/// `MAX_REQUEST` bytes (in parts when longer than one command) and whose replies
/// usually fit one command. Reads up to `read_max` bytes; writes up to `write_max`
/// bytes, their data inline.
///
/// A request whose lane reply times out is sent again on TCP while the lane's copy may
/// still be queued at the server. Cached operations run once per id whichever way they
/// come; a write or lseek (in no reply cache) would run late and undo what the session
/// did since (review finding `a_write_resent_on_tcp_after_a_lane_timeout_is_not_executed_
/// again_later`), so no request goes again on TCP before the lane is fenced at the server
/// (`L2Release`: answered once no lane request runs, and none runs after).
pub fn rides_l2(
    req: &Request,
    body_len: usize,
    data_len: usize,
    read_max: u32,
    write_max: u32,
) -> bool {
    let fits = request_len(body_len, data_len) <= MAX_REQUEST;
    fits && match req {
        Request::Read(r) => r.size > 0 && r.size <= read_max.min(MAX_READ),
        Request::Write(_) => write_max > 0 && data_len <= write_max.min(MAX_WRITE) as usize,
        r => matches!(
            r.op(),
            Op::Lookup
                | Op::Getattr
                | Op::Setattr
                | Op::Open
                | Op::Release
                | Op::Flush
                | Op::Fsync
                | Op::Statfs
                | Op::Access
                | Op::Readlink
                | Op::Getxattr
                | Op::Create
                | Op::Mknod
                | Op::Mkdir
                | Op::Unlink
                | Op::Rmdir
                | Op::Symlink
                | Op::Link
                | Op::Rename
                | Op::Ping
                | Op::Lseek
        ),
    }
}

/// Where the fence of a lane that went down stands (`L2Release` on TCP: answered once no
/// lane request of the session runs at the server, and none runs after).
#[derive(Debug)]
pub(crate) enum Fence {
    /// Not asked for yet.
    Open,
    /// Sent; a thread waits for its answer.
    Sent,
    /// Answered at this time.
    Done(Instant),
    /// The last attempt failed at this time, for this reason.
    Failed(Instant, zcfs_backend::Error),
}

impl L2Lane {
    /// When the server answered the fence, if it did.
    pub(crate) fn fenced_at(&self) -> Option<Instant> {
        match &*lock(&self.fence) {
            Fence::Done(at) => Some(*at),
            _ => None,
        }
    }
}

/// Requests that may run twice, one copy late, without effect: after the lane falls
/// they go to TCP without waiting for its fence (`Client::l2_unfenced`).
pub fn free_of_effects(op: Op) -> bool {
    matches!(
        op,
        Op::Read
            | Op::Getattr
            | Op::Lookup
            | Op::Statfs
            | Op::Readlink
            | Op::Getxattr
            | Op::Access
            | Op::Ping
            | Op::Flush
            | Op::Fsync
    )
}

/// Why a request did not get its answer on the lane: send it on TCP (same id).
#[derive(Debug)]
pub(crate) struct Fallback;

/// Counters of the lane (`zcfs stat MOUNTPOINT`).
pub struct L2Counters {
    /// Requests answered over layer 2, per operation code.
    pub requests: [AtomicU64; OP_SLOTS],
    /// Requests that went to TCP after trying the lane (lost peer, reply too large).
    pub fell_back: AtomicU64,
    /// Writes whose data landed in place (a transfer into the server's blocks), and
    /// their bytes.
    pub landed: AtomicU64,
    pub landed_bytes: AtomicU64,
}

impl L2Counters {
    pub(crate) fn new() -> L2Counters {
        L2Counters {
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            fell_back: AtomicU64::new(0),
            landed: AtomicU64::new(0),
            landed_bytes: AtomicU64::new(0),
        }
    }
}

struct Waiter {
    reply: Option<Result<(RespHeader, Vec<u8>), Fallback>>,
    /// The read's transfer and slot.
    xfer: Option<(u32, u32)>,
    committed: bool,
    /// A landing write: its send slot and blocks (taken by the transfer once the
    /// server asked for the data).
    land: Option<Landing>,
    /// Sent in parts (full-size command frames).
    parts: bool,
}

impl Waiter {
    /// Its caller can return: an answer without data due (not a read, an error, or
    /// the read's data in), or the fallback to TCP.
    fn done(&self) -> bool {
        match &self.reply {
            Some(Ok((h, _))) => self.xfer.is_none() || self.committed || h.status != 0,
            Some(Err(_)) => true,
            None => false,
        }
    }

    /// A read with its reply in and its data not yet, or its data in and its reply not
    /// yet: the server sends the two back to back, so the rest is on its way.
    fn half_done(&self) -> bool {
        self.xfer.is_some() && (self.committed != self.reply.is_some())
    }
}

/// What a waiter does between two polls of the lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pause {
    /// Poll again at once, giving the CPU to any thread ready on it first.
    Yield,
    /// Sleep in poll(2) on the lane's sockets, at most `WAIT_SLICE`.
    Sleep,
}

/// How a waiter of `poll` mode pauses: busy ones never sleep; waiting ones sleep
/// unless frames of theirs wait to go (`sending`: nothing on the sockets would wake
/// them for that) or, for `HALF_DONE_SPIN` after `half_since`, half of their read is in.
fn pause(poll: L2Poll, sending: bool, half_since: Option<Instant>, now: Instant) -> Pause {
    let rest_due = half_since.is_some_and(|t| now.saturating_duration_since(t) < HALF_DONE_SPIN);
    match poll {
        L2Poll::Busy => Pause::Yield,
        L2Poll::Wait if sending || rest_due => Pause::Yield,
        L2Poll::Wait => Pause::Sleep,
    }
}

/// Full-size frames of one kind due over a lane, and whether any ever arrived.
#[derive(Default)]
struct Due {
    due: AtomicBool,
    came: AtomicBool,
}

impl Due {
    fn due(&self) {
        self.due.store(true, Ordering::SeqCst);
    }
    fn came(&self) {
        self.came.store(true, Ordering::SeqCst);
    }
    fn never_came(&self) -> bool {
        self.due.load(Ordering::SeqCst) && !self.came.load(Ordering::SeqCst)
    }
}

/// A landing write's data, staged in a send slot.
#[derive(Clone, Copy, Debug)]
struct Landing {
    slot: u32,
    blocks: u32,
    /// The transfer sends from the slot (it goes back at Delivered or Failed).
    sent: bool,
}

struct Inner {
    ep: Endpoint<XskSocket, XskSocket>,
    polling: bool,
    /// Callers waiting on `L2Lane::cv` for the polling leader to hand out their replies
    /// (a notify is a system call even with no one waiting: only these need one).
    followers: usize,
    waiting: HashMap<u64, Waiter>,
    /// Transfer id -> (slot, request id still waiting for it).
    xfers: HashMap<u32, (u32, Option<u64>)>,
    free_slots: Vec<u32>,
    /// Send slots not in use, and the server's transfer ids sending from the others.
    free_send: Vec<u32>,
    sending: HashMap<u32, u32>,
}

/// An open lane.
pub(crate) struct L2Lane {
    inner: Mutex<Inner>,
    cv: Condvar,
    up: AtomicBool,
    /// A reply came over the lane: it reaches the server (the set-up's probe waits for
    /// one before the lane is used).
    answered: AtomicBool,
    /// Full-size frames due over the lane, per kind: a read's data (server to client),
    /// a landing write's blocks and a request in parts (client to server). A lane lost
    /// with frames of one kind due and none of that kind ever arrived may be one whose
    /// link drops full-size frames one way (an MTU mismatch), and counts as silent; one
    /// that carried only small commands does not (review 27d; per kind, review 28b: a
    /// landing write's blocks getting through hid reads whose data never came).
    reads: Due,
    lands: Due,
    parts: Due,
    /// Why the lane went down (stats; empty while up).
    reason: Mutex<String>,
    poll: L2Poll,
    read_max: u32,
    write_max: u32,
    land_max: u32,
    /// Where send slot 0 is in `region`.
    send_base: u64,
    geometry: SlotGeometry,
    region: Arc<Region>,
    fds: [i32; 2],
    t0: Instant,
    flush: Arc<FlushSignal>,
    /// The lane's fence at the server (`L2Release`), asked for once the lane is down.
    pub(crate) fence: Mutex<Fence>,
    /// Signalled when `fence` leaves `Fence::Sent`.
    pub(crate) fence_changed: Condvar,
    pub mode: BindMode,
    // Last: detached after the sockets closed.
    _prog: XdpProgram,
}

/// Wakes the lane's flusher thread (see [`L2Lane::start_flusher`]).
#[derive(Default)]
struct FlushSignal {
    m: Mutex<()>,
    cv: Condvar,
    /// The flusher sleeps without a deadline (nothing was deferred when it looked).
    idle: AtomicBool,
    stop: AtomicBool,
}

impl Drop for L2Lane {
    /// End the flusher now rather than at its next deadline.
    fn drop(&mut self) {
        self.flush.stop.store(true, Ordering::SeqCst);
        let _g = lock(&self.flush.m);
        self.flush.cv.notify_all();
    }
}

/// The local half, before the offer: the program and sockets on the interface.
pub(crate) struct Local {
    prog: XdpProgram,
    data: XskSocket,
    cmd: XskSocket,
    region: Arc<Region>,
    pub mac: [u8; 6],
    pub geometry: SlotGeometry,
    scratch: u64,
    send_base: u64,
}

/// Open the interface for the lane (any failure: the session stays on TCP).
pub(crate) fn open_local(o: &L2Options) -> Result<Local, String> {
    let read_max = o.read_max.clamp(1, MAX_READ);
    let slot_blocks = read_max.div_ceil(BLOCK_SIZE as u32);
    let geometry = SlotGeometry::packed(BLOCK_SIZE as u64, slot_blocks, RECEIVE_SLOTS);
    let end = geometry.first + geometry.stride * RECEIVE_SLOTS as u64;
    let scratch = end.div_ceil(BLOCK_SIZE as u64) * BLOCK_SIZE as u64;
    // The send slots behind the scratch, block-aligned.
    let send_base =
        (scratch + TX_CHUNKS as u64 * CMD_CHUNK).div_ceil(BLOCK_SIZE as u64) * BLOCK_SIZE as u64;
    let len = send_base + SEND_SLOTS as u64 * SEND_SLOT_BYTES + BLOCK_SIZE as u64;
    let region = Arc::new(Region::anonymous(len as usize).map_err(|e| e.to_string())?);
    geometry.check(region.len()).map_err(|e| e.to_string())?;
    let mac = mac_address(&o.iface).map_err(|e| e.to_string())?;
    let mut prog = XdpProgram::attach(&o.iface).map_err(|e| e.to_string())?;
    let cfg = XskConfig {
        busy_poll: o.poll == L2Poll::Busy,
        ..XskConfig::default()
    };
    let cmd_region = Arc::new(Region::anonymous(CMD_REGION_LEN).map_err(|e| e.to_string())?);
    let data = bind_retrying(|| XskSocket::new(region.clone(), &o.iface, DATA_QUEUE, cfg))
        .map_err(|e| e.to_string())?;
    let cmd = bind_retrying(|| XskSocket::new(cmd_region.clone(), &o.iface, CMD_QUEUE, cfg))
        .map_err(|e| e.to_string())?;
    prog.register(DATA_QUEUE, &data)
        .map_err(|e| e.to_string())?;
    prog.register(CMD_QUEUE, &cmd).map_err(|e| e.to_string())?;
    Ok(Local {
        prog,
        data,
        cmd,
        region,
        mac,
        geometry,
        scratch,
        send_base,
    })
}

impl L2Lane {
    /// The lane over `local` with the server at `peer_mac`, frames tagged with a key
    /// from `key`.
    /// `open_tags`: the session has no shared secret (`Config::open_tags`).
    pub(crate) fn new(
        local: Local,
        o: &L2Options,
        peer_mac: [u8; 6],
        key: &[u8],
        open_tags: bool,
    ) -> Result<L2Lane, String> {
        let fds = [local.cmd.as_raw_fd(), local.data.as_raw_fd()];
        let mode = local.data.mode();
        let cfg = Config {
            local_mac: local.mac,
            peer_mac,
            rto_ns: RTO.as_nanos() as u64,
            quiet_ns: QUIET.as_nanos() as u64,
            transfer_timeout_ns: TRANSFER_TIMEOUT.as_nanos() as u64,
            credit_frames: zcfs_l2::endpoint::MAX_CREDIT_FRAMES,
            tx_scratch: (local.scratch, TX_CHUNKS),
            open_tags,
        };
        let ep = Endpoint::new(cfg, key, local.data, local.cmd).map_err(|e| e.to_string())?;
        Ok(L2Lane {
            inner: Mutex::new(Inner {
                ep,
                polling: false,
                followers: 0,
                waiting: HashMap::new(),
                xfers: HashMap::new(),
                free_slots: (0..RECEIVE_SLOTS).rev().collect(),
                free_send: (0..SEND_SLOTS).rev().collect(),
                sending: HashMap::new(),
            }),
            cv: Condvar::new(),
            up: AtomicBool::new(true),
            answered: AtomicBool::new(false),
            reads: Due::default(),
            lands: Due::default(),
            parts: Due::default(),
            reason: Mutex::new(String::new()),
            poll: o.poll,
            read_max: o.read_max.clamp(1, MAX_READ),
            write_max: o.write_max.min(MAX_WRITE),
            land_max: o
                .land_max
                .unwrap_or(default_land_max(o.poll))
                .min(MAX_LANDING_WRITE),
            send_base: local.send_base,
            geometry: local.geometry,
            region: local.region,
            fds,
            t0: Instant::now(),
            flush: Arc::new(FlushSignal::default()),
            fence: Mutex::new(Fence::Open),
            fence_changed: Condvar::new(),
            mode,
            _prog: local.prog,
        })
    }

    /// Start the thread that sends what the endpoint defers (bare acks and DONE records
    /// wait for the next request to ride with: `Endpoint::deferred_due`) when no caller
    /// polls by then: a caller stops polling as soon as it has its answer, and without
    /// this the server would retransmit its reply after the RTO. It holds the lane only
    /// while it polls, so dropping the lane ends it (within [`FLUSHER_IDLE`]).
    pub(crate) fn start_flusher(self: &Arc<Self>) -> std::io::Result<()> {
        let lane = Arc::downgrade(self);
        let sig = self.flush.clone();
        std::thread::Builder::new()
            .name("zcfs-l2-flush".into())
            .spawn(move || loop {
                let wait = {
                    let Some(lane) = lane.upgrade() else { return };
                    if !lane.is_up() {
                        return;
                    }
                    let mut inner = lock(&lane.inner);
                    match inner.ep.deferred_due() {
                        Some(due) if lane.now() >= due => {
                            if inner.polling {
                                // A caller polls (and sends what is due); look again
                                // later rather than spin beside it on 2 vCPUs.
                                FLUSHER_RETRY
                            } else {
                                lane.poll_once(&mut inner);
                                match inner.ep.deferred_due() {
                                    // Still due (no TX chunk free): not a spin.
                                    Some(d) if lane.now() >= d => FLUSHER_RETRY,
                                    // Looked at again at once: the next deadline, if any.
                                    _ => Duration::ZERO,
                                }
                            }
                        }
                        Some(due) => Duration::from_nanos(due - lane.now()),
                        None => {
                            sig.idle.store(true, Ordering::SeqCst);
                            FLUSHER_IDLE
                        }
                    }
                };
                if sig.stop.load(Ordering::SeqCst) {
                    return;
                }
                if !wait.is_zero() {
                    let g = lock(&sig.m);
                    // A caller that deferred something since we looked cleared `idle`
                    // before taking `m` to notify: then do not sleep (its notify may
                    // have come before this wait).
                    let woken = wait == FLUSHER_IDLE && !sig.idle.load(Ordering::SeqCst);
                    if !woken {
                        drop(sig.cv.wait_timeout(g, wait));
                    }
                } else {
                    std::thread::yield_now();
                }
                sig.idle.store(false, Ordering::SeqCst);
            })
            .map(|_| ())
    }

    /// A caller is done polling: wake the flusher if something is deferred and it
    /// sleeps without a deadline (in a stream of requests it rarely does: no syscall).
    fn kick_flusher(&self, inner: &Inner) {
        if inner.ep.deferred_due().is_some() && self.flush.idle.swap(false, Ordering::SeqCst) {
            let _g = lock(&self.flush.m);
            self.flush.cv.notify_one();
        }
    }

    pub(crate) fn endpoint_stats(&self) -> zcfs_l2::Stats {
        lock(&self.inner).ep.stats()
    }

    /// The endpoint's counters and recent protocol events.
    pub(crate) fn debug_state(&self) -> String {
        let inner = lock(&self.inner);
        format!("{:?}\n{}", inner.ep.stats(), inner.ep.debug_state())
    }

    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    /// Why the lane went down (empty while up).
    pub(crate) fn reason(&self) -> String {
        lock(&self.reason).clone()
    }

    pub(crate) fn read_max(&self) -> u32 {
        self.read_max
    }

    pub(crate) fn write_max(&self) -> u32 {
        self.write_max
    }

    /// Whether a write of `data_len` bytes lands in place: larger than the lane carries
    /// inline, at most `land_max`.
    pub(crate) fn lands(&self, req: &Request, data_len: usize) -> bool {
        matches!(req, Request::Write(_))
            && data_len > self.write_max as usize
            && data_len <= self.land_max as usize
    }

    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// Whether a reply ever came over the lane.
    pub(crate) fn answered(&self) -> bool {
        self.answered.load(Ordering::SeqCst)
    }

    /// Full-size frames of some kind were due over the lane and none of that kind ever
    /// arrived: lost so, the lane may be one whose link drops them.
    pub(crate) fn data_never_came(&self) -> bool {
        [&self.reads, &self.lands, &self.parts]
            .iter()
            .any(|d| d.never_came())
    }

    /// Full-size frames came over the lane (a read's data, a landing write's blocks, a
    /// request in parts).
    pub(crate) fn data_came(&self) -> bool {
        [&self.reads, &self.lands, &self.parts]
            .iter()
            .any(|d| d.came.load(Ordering::SeqCst))
    }

    /// The lane is lost: everyone waiting goes to TCP. Logged if the lane had carried a
    /// reply; one that never did is the set-up's probe failing, which the set-up
    /// reports.
    fn down(&self, inner: &mut Inner, why: &str) {
        if self.up.swap(false, Ordering::SeqCst) {
            if self.answered() {
                tracing::warn!(
                    "layer-2 lane lost, requests go on TCP until it is set up again: {why}"
                );
            } else {
                tracing::debug!("layer-2 lane never answered: {why}");
            }
            *lock(&self.reason) = why.to_string();
        }
        for w in inner.waiting.values_mut() {
            // Also a read whose reply came but whose data never will (the server died
            // mid-transfer): left as it was, its caller would spin here for ever.
            let data_due = w.xfer.is_some()
                && !w.committed
                && matches!(&w.reply, Some(Ok((h, _))) if h.status == 0);
            if w.reply.is_none() || data_due {
                w.reply = Some(Err(Fallback));
            }
        }
        self.cv.notify_all();
    }

    /// Poll once and hand out what arrived.
    fn poll_once(&self, inner: &mut Inner) {
        let events = match inner.ep.poll(self.now()) {
            Ok(e) => e,
            Err(e) => {
                self.down(inner, &format!("endpoint: {e}"));
                return;
            }
        };
        for ev in events {
            match ev {
                Event::Command(bytes) => match decode_reply(&bytes) {
                    Ok(L2Reply::Reply { header, body }) => {
                        self.answered.store(true, Ordering::SeqCst);
                        if let Some(w) = inner.waiting.get_mut(&header.id) {
                            // The server promised a read's data: it is due now.
                            if w.xfer.is_some() && header.status == 0 && header.data_len > 0 {
                                self.reads.due();
                            }
                            // Any answer: the server had every part.
                            if w.parts {
                                self.parts.came();
                            }
                            w.reply = Some(Ok((header, body.to_vec())));
                        }
                    }
                    Ok(L2Reply::ResendTcp { id }) => {
                        self.answered.store(true, Ordering::SeqCst);
                        let mut cancel = None;
                        if let Some(w) = inner.waiting.get_mut(&id) {
                            w.reply = Some(Err(Fallback));
                            cancel = w.xfer.map(|(x, _)| x);
                        }
                        // No data will come for it: its slot comes back without waiting
                        // for the transfer to time out.
                        if let Some(x) = cancel {
                            inner.ep.cancel(x);
                        }
                    }
                    Ok(L2Reply::SendData { id, xfer, extents }) => {
                        self.answered.store(true, Ordering::SeqCst);
                        self.send_landing(inner, id, xfer, &extents);
                    }
                    Err(e) => tracing::debug!("malformed layer-2 reply dropped: {e}"),
                },
                Event::Delivered(x) | Event::Failed(x) => {
                    // A landing write's data left (or the server gave it up): its
                    // send slot is free again.
                    if let Some(slot) = inner.sending.remove(&x) {
                        inner.free_send.push(slot);
                    }
                }
                Event::Committed(x) | Event::SlotsFree(x) => {
                    if matches!(ev, Event::Committed(_)) && inner.xfers.contains_key(&x) {
                        // A read's data came (its caller may have gone already).
                        self.reads.came();
                    }
                    if let Some((slot, who)) = inner.xfers.get(&x).copied() {
                        match who.and_then(|id| inner.waiting.get_mut(&id)) {
                            Some(w) if matches!(ev, Event::Committed(_)) => {
                                w.committed = true;
                            }
                            Some(w) => {
                                // Its slots are free again but it never arrived.
                                w.reply = Some(Err(Fallback));
                            }
                            None => {
                                inner.xfers.remove(&x);
                                inner.free_slots.push(slot);
                            }
                        }
                    }
                }
                Event::Aborted(x) => {
                    if let Some((_, Some(id))) = inner.xfers.get(&x).copied() {
                        if let Some(w) = inner.waiting.get_mut(&id) {
                            w.reply = Some(Err(Fallback));
                        }
                        // The slot waits for SlotsFree.
                        if let Some(e) = inner.xfers.get_mut(&x) {
                            e.1 = None;
                        }
                    }
                }
            }
        }
        // Followers see what arrived (theirs, or that the leader's turn may end): woken
        // only when there are any, since every poll of a spinning leader comes here.
        if inner.followers > 0 {
            self.cv.notify_all();
        }
    }

    /// The server asks for landing write `id`'s data as transfer `xfer` in extents of
    /// `extents` blocks: send it from the write's send slot. Anything that does not
    /// match the write (no such write waiting, another block count, data sent already)
    /// is dropped: the server then gets no data, aborts the transfer and commits
    /// nothing.
    fn send_landing(&self, inner: &mut Inner, id: u64, xfer: u32, extents: &[u16]) {
        let Some(land) = inner.waiting.get(&id).and_then(|w| w.land) else {
            tracing::debug!(
                id,
                "layer-2 send-data for no landing write waiting: dropped"
            );
            return;
        };
        let total: u64 = extents.iter().map(|&k| k as u64).sum();
        if land.sent || total != land.blocks as u64 {
            tracing::debug!(id, "layer-2 send-data that does not fit its write: dropped");
            return;
        }
        let mut at = self.send_slot(land.slot);
        let exts: Vec<Extent> = extents
            .iter()
            .map(|&k| {
                let e = Extent {
                    offset: at,
                    blocks: k as u32,
                };
                at += k as u64 * BLOCK_SIZE as u64;
                e
            })
            .collect();
        match inner.ep.send(xfer, &exts) {
            Ok(()) => {
                inner.sending.insert(xfer, land.slot);
                self.lands.due();
                if let Some(w) = inner.waiting.get_mut(&id) {
                    w.land = Some(Landing { sent: true, ..land });
                }
            }
            Err(e) => tracing::debug!(id, "layer-2 landing data not sent: {e}"),
        }
    }

    /// Where send slot `i` begins in the region.
    fn send_slot(&self, i: u32) -> u64 {
        self.send_base + i as u64 * SEND_SLOT_BYTES
    }

    /// Stage a landing write's `data` for a write at `offset` in a free send slot:
    /// the write's bytes at their place in its blocks, the rest of the first and last
    /// block zero (the server takes those bytes from the file). None: no slot free.
    /// The copy runs without the lane's lock (up to 1 MiB: the other callers poll on);
    /// the slot is this caller's alone once taken.
    fn stage_landing(&self, offset: u64, data: &[&[u8]]) -> Option<Landing> {
        let len: usize = data.iter().map(|d| d.len()).sum();
        let blocks = blocks_spanned(offset, len as u32);
        let slot = lock(&self.inner).free_send.pop()?;
        let base = self.send_slot(slot);
        let lead = offset % BLOCK_SIZE as u64;
        let end = lead + len as u64;
        let span = blocks as u64 * BLOCK_SIZE as u64;
        debug_assert!(span <= SEND_SLOT_BYTES);
        let mut ok = self.region.write(base, &vec![0u8; lead as usize]).is_ok();
        let mut at = base + lead;
        for d in data {
            ok &= self.region.write(at, d).is_ok();
            at += d.len() as u64;
        }
        ok &= self
            .region
            .write(base + end, &vec![0u8; (span - end) as usize])
            .is_ok();
        if !ok {
            lock(&self.inner).free_send.push(slot);
            return None;
        }
        Some(Landing {
            slot,
            blocks,
            sent: false,
        })
    }

    /// Send request `id` (header `hdr`, `body`, inline `data`) on the lane and wait for
    /// its reply; `Err(Fallback)`: send it on TCP.
    pub(crate) fn call(
        &self,
        req: &Request,
        hdr: &[u8; REQ_HDR],
        body: &[u8],
        data: &[&[u8]],
        counters: &L2Counters,
    ) -> Result<Response, Fallback> {
        let id = u64::from_le_bytes(hdr[8..16].try_into().expect("8 bytes"));
        let data_len: usize = data.iter().map(|d| d.len()).sum();
        let mut land = None;
        if let (Request::Write(w), true) = (req, self.lands(req, data_len)) {
            match self.stage_landing(w.offset, data) {
                Some(l) => land = Some(l),
                None => return Err(Fallback),
            }
        }
        let mut inner = lock(&self.inner);
        if !self.is_up() {
            if let Some(l) = land {
                inner.free_send.push(l.slot);
            }
            return Err(Fallback);
        }
        let mut xfer = None;
        if let Request::Read(r) = req {
            let blocks = r.size.div_ceil(BLOCK_SIZE as u32);
            let Some(slot) = inner.free_slots.pop() else {
                return Err(Fallback);
            };
            let s = self.geometry.slot(slot).expect("a slot of the geometry");
            let ext = Extent {
                offset: s.offset,
                blocks,
            };
            match inner.ep.expect(&[ext]) {
                Ok(x) => {
                    inner.xfers.insert(x, (slot, Some(id)));
                    xfer = Some((x, slot));
                }
                Err(e) => {
                    inner.free_slots.push(slot);
                    tracing::debug!("layer-2 read not expected: {e}");
                    return Err(Fallback);
                }
            }
        }
        let (x, blocks) = match (xfer, req) {
            (Some((x, _)), Request::Read(r)) => (x, r.size.div_ceil(BLOCK_SIZE as u32)),
            _ => (0, 0),
        };
        let cmd = match land {
            Some(l) => encode_landing_write(l.blocks, hdr, body),
            None => encode_request(x, blocks, hdr, body, data),
        };
        // Parts of one request are queued together (under the lane's lock), so the
        // server gathers them one request at a time.
        let mut in_parts = false;
        let sent = match split_request(cmd, MAX_COMMAND) {
            Ok(parts) => {
                in_parts = parts.len() > 1;
                inner.ep.send_commands(parts).map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = sent {
            if let Some(l) = land {
                inner.free_send.push(l.slot);
            }
            if let Some((x, _)) = xfer {
                // Posted: its slot comes back when the transfer times out.
                if let Some(e) = inner.xfers.get_mut(&x) {
                    e.1 = None;
                }
            }
            tracing::debug!("layer-2 command not sent: {e}");
            return Err(Fallback);
        }
        if in_parts {
            self.parts.due();
        }
        inner.waiting.insert(
            id,
            Waiter {
                reply: None,
                xfer,
                committed: false,
                land,
                parts: in_parts,
            },
        );
        let deadline = Instant::now() + L2_REPLY_TIMEOUT;
        // Polls in a row with frames to send and none sent (MAX_IDLE_TX_POLLS).
        let mut idle_tx = 0u32;
        // Since when half of this read is in: its reply or its data (HALF_DONE_SPIN).
        let mut half_since: Option<Instant> = None;
        loop {
            if inner.waiting.get(&id).is_some_and(Waiter::done) {
                self.kick_flusher(&inner);
                let w = inner.waiting.remove(&id).expect("checked");
                if let Some(l) = w.land {
                    // A slot the transfer does not send from is free now; one it
                    // sends from comes back at Delivered or Failed.
                    if !l.sent {
                        inner.free_send.push(l.slot);
                    }
                    // The server answers a landing whose data it asked for only once every
                    // block arrived (an abort goes back to TCP): an error too, when the
                    // commit failed (review 28d).
                    if l.sent && matches!(&w.reply, Some(Ok(_))) {
                        self.lands.came();
                    }
                    if matches!(&w.reply, Some(Ok((h, _))) if h.status == 0) {
                        counters.landed.fetch_add(1, Ordering::Relaxed);
                        counters
                            .landed_bytes
                            .fetch_add(data_len as u64, Ordering::Relaxed);
                    }
                }
                if let Some((x, slot)) = w.xfer {
                    if w.committed {
                        inner.xfers.remove(&x);
                    } else if let Some(e) = inner.xfers.get_mut(&x) {
                        // Freed when it commits or its slots are free.
                        e.1 = None;
                    }
                    let r = self.finish(w.reply.expect("done"), Some(slot));
                    if w.committed {
                        inner.free_slots.push(slot);
                    }
                    if r.is_ok() {
                        counters.requests[req.op() as usize].fetch_add(1, Ordering::Relaxed);
                    } else {
                        counters.fell_back.fetch_add(1, Ordering::Relaxed);
                    }
                    return r;
                }
                let r = self.finish(w.reply.expect("done"), None);
                if r.is_ok() {
                    counters.requests[req.op() as usize].fetch_add(1, Ordering::Relaxed);
                } else {
                    counters.fell_back.fetch_add(1, Ordering::Relaxed);
                }
                return r;
            }
            if Instant::now() >= deadline {
                self.down(
                    &mut inner,
                    &format!(
                        "no reply to a {} within {L2_REPLY_TIMEOUT:?}",
                        req.op().name()
                    ),
                );
                continue;
            }
            if inner.polling {
                // A follower: the leader hands out our reply.
                inner.followers += 1;
                inner = self
                    .cv
                    .wait_timeout(inner, WAIT_SLICE)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                inner.followers -= 1;
                continue;
            }
            inner.polling = true;
            let sent_before = inner.ep.tx_frames();
            self.poll_once(&mut inner);
            // Done: back to the top, which returns. A read whose reply came without its
            // data is not done: it pauses like any waiter (review 35b: it polled again
            // at once, holding the lane's lock, until its data or the reply timeout,
            // a core for up to 1 s when the data was lost).
            if inner.waiting.get(&id).is_some_and(Waiter::done) {
                inner.polling = false;
                continue;
            }
            // Frames to send (a landing write's data): nothing on the sockets would wake
            // a sleeper for them, so poll again at once (waiting, a 1 MiB landing write
            // took 11.8 ms against 1.5 ms on TCP).
            // Counted across sleeps: only frames moving (or none left) start it afresh
            // (review 28d: reset after each sleep, it spun 64 polls per slice).
            let moved = inner.ep.tx_frames() != sent_before;
            let pending = inner.ep.tx_pending();
            idle_tx = if moved || !pending { 0 } else { idle_tx + 1 };
            let sending = pending && idle_tx <= zcfs_l2::MAX_IDLE_TX_POLLS;
            // The server sends a read's data and then its reply, one right after the
            // other: with one of them in, sleeping for the other cost a second wake-up
            // (waiting, a mount slept 1.85 times per 4 KiB read, now 1.03).
            if inner.waiting.get(&id).is_some_and(Waiter::half_done) {
                half_since.get_or_insert_with(Instant::now);
            }
            drop(inner);
            // A spinning waiter gives its CPU to any thread that is ready there: it
            // never sleeps, but it does not hold the CPU while a thread it needs (the
            // server beside it on one host, the FUSE thread's application) waits for
            // the scheduler's slice to end. With a bare spin, a mount's waiter woken on
            // the busy server's CPU held it for milliseconds while the other CPU stayed
            // idle: p99 1.1-3.6 ms against 65-74 µs yielding (docs/benchmarks.md, "A
            // busy lane waiter that yields").
            match pause(self.poll, sending, half_since, Instant::now()) {
                Pause::Yield => std::thread::yield_now(),
                Pause::Sleep => self.sleep(),
            }
            inner = lock(&self.inner);
            inner.polling = false;
        }
    }

    /// Sleep until a frame arrives on either socket or WAIT_SLICE passed.
    fn sleep(&self) {
        let mut pfd = self.fds.map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: two valid pollfds; the sockets live as long as self.
        unsafe { libc::poll(pfd.as_mut_ptr(), 2, WAIT_SLICE.as_millis() as i32) };
    }

    fn finish(
        &self,
        reply: Result<(RespHeader, Vec<u8>), Fallback>,
        slot: Option<u32>,
    ) -> Result<Response, Fallback> {
        let (hdr, body) = reply?;
        let mut data = Vec::new();
        if hdr.status == 0 && hdr.data_len > 0 {
            let Some(slot) = slot else {
                return Err(Fallback);
            };
            let s = self.geometry.slot(slot).expect("a slot of the geometry");
            if hdr.data_len as u64 > s.bytes() {
                return Err(Fallback);
            }
            data = vec![0u8; hdr.data_len as usize];
            self.region
                .read(s.offset, &mut data)
                .map_err(|_| Fallback)?;
        }
        Ok(Response {
            hdr,
            body,
            data,
            epoch: 0,
        })
    }
}

#[cfg(test)]
mod lane_safety_tests {
    use super::*;
    use zcfs_protocol::{LseekReq, NodeRef, WriteReq, ALL_OPS};

    fn waiter(read: bool, reply: bool, committed: bool) -> Waiter {
        Waiter {
            reply: reply.then(|| Ok((RespHeader::ok(Op::Read, 1, 0, 4096), Vec::new()))),
            xfer: read.then_some((7, 0)),
            committed,
            land: None,
            parts: false,
        }
    }

    /// A caller returns once its answer needs no data, or the data came, or it goes to
    /// TCP; a read's reply alone is not done (review 35b: taken as done, the waiter
    /// polled again at once, holding the lane's lock, until its data or the timeout).
    #[test]
    fn a_read_is_done_with_its_data_an_error_or_the_fallback_not_its_reply_alone() {
        assert!(!waiter(true, true, false).done());
        assert!(waiter(true, true, true).done());
        assert!(!waiter(true, false, true).done());
        assert!(waiter(false, true, false).done());
        assert!(!waiter(false, false, false).done());
        let mut failed = waiter(true, false, false);
        failed.reply = Some(Ok((RespHeader::error(Op::Read, 1, libc::EIO), Vec::new())));
        assert!(failed.done());
        let mut fallback = waiter(true, false, false);
        fallback.reply = Some(Err(Fallback));
        assert!(fallback.done());
    }

    /// Half of a read is its reply without its data, or its data without its reply;
    /// nothing of it, all of it, or a request without data (no transfer) is not.
    #[test]
    fn half_a_read_is_its_reply_or_its_data_alone() {
        assert!(waiter(true, true, false).half_done());
        assert!(waiter(true, false, true).half_done());
        assert!(!waiter(true, false, false).half_done());
        assert!(!waiter(true, true, true).half_done());
        assert!(!waiter(false, true, false).half_done());
        assert!(!waiter(false, false, false).half_done());
    }

    /// The pause rule alone (the loop in `call` that uses it is tested over a real lane
    /// in crates/server/tests/l2lane.rs, `a_waiting_read_with_its_reply_but_not_its_
    /// data_sleeps_after_the_half_done_spin`): a waiting lane polls again at once for
    /// HALF_DONE_SPIN after half of a read came in, and from then on sleeps; busy ones
    /// always yield, and frames to send always keep a waiter polling.
    #[test]
    fn a_waiting_caller_polls_again_for_the_rest_of_a_read_up_to_the_bound() {
        let t = Instant::now();
        let at = |d: Duration| t + d;
        assert_eq!(
            pause(L2Poll::Wait, false, None, at(Duration::ZERO)),
            Pause::Sleep
        );
        assert_eq!(pause(L2Poll::Wait, false, Some(t), t), Pause::Yield);
        let just_before = HALF_DONE_SPIN - Duration::from_nanos(1);
        assert_eq!(
            pause(L2Poll::Wait, false, Some(t), at(just_before)),
            Pause::Yield
        );
        assert_eq!(
            pause(L2Poll::Wait, false, Some(t), at(HALF_DONE_SPIN)),
            Pause::Sleep
        );
        assert_eq!(
            pause(L2Poll::Wait, true, Some(t), at(HALF_DONE_SPIN)),
            Pause::Yield
        );
        assert_eq!(pause(L2Poll::Wait, true, None, t), Pause::Yield);
        assert_eq!(pause(L2Poll::Busy, false, None, t), Pause::Yield);
        assert_eq!(
            pause(L2Poll::Busy, false, Some(t), at(Duration::from_secs(1))),
            Pause::Yield
        );
    }

    /// A request resent on TCP after a lane timeout may also run from the lane later:
    /// operations outside the reply cache ride the lane only because nothing goes again
    /// on TCP before the fence (`L2Release`). They are listed here so that a new one is
    /// looked at; the lane's own set-up and release never ride it.
    #[test]
    fn operations_outside_the_reply_cache_are_known_and_the_lanes_own_stay_on_tcp() {
        let uncached: Vec<Op> = ALL_OPS.iter().copied().filter(|o| !o.cached()).collect();
        assert_eq!(
            uncached,
            vec![
                Op::Read,
                Op::Write,
                Op::Ping,
                Op::Stats,
                Op::Lseek,
                Op::L2Setup,
                Op::L2Release
            ],
            "a new operation outside the reply cache: decide whether it may ride the lane"
        );
        let node = NodeRef::new(5, 1);
        let write = |size: u32| -> Request {
            WriteReq {
                node,
                fh: 1,
                offset: 0,
                size,
                commit: false,
            }
            .into()
        };
        let lseek: Request = LseekReq {
            node,
            fh: 1,
            offset: 0,
            whence: libc::SEEK_DATA,
        }
        .into();
        let w = MAX_WRITE;
        assert!(
            rides_l2(&write(4), 40, 4, MAX_READ, w),
            "a small write rides"
        );
        assert!(rides_l2(&lseek, 40, 0, MAX_READ, w));
        // At the bound: the largest write rides (in parts), one byte more goes on TCP,
        // as does one byte more than the lane's `write_max`.
        let most = MAX_WRITE as usize;
        assert!(request_len(40, most) <= MAX_REQUEST);
        assert!(rides_l2(&write(most as u32), 40, most, MAX_READ, w));
        assert!(!rides_l2(
            &write(most as u32 + 1),
            40,
            most + 1,
            MAX_READ,
            w
        ));
        assert!(rides_l2(&write(4096), 40, 4096, MAX_READ, 4096));
        assert!(!rides_l2(&write(4097), 40, 4097, MAX_READ, 4096));
        assert!(
            !rides_l2(&write(1), 40, 1, MAX_READ, 0),
            "write_max 0: none"
        );
        let setup: Request = zcfs_protocol::L2ReleaseReq {}.into();
        assert!(!rides_l2(&setup, 0, 0, MAX_READ, w));
    }
}
