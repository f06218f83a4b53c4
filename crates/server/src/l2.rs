//! The layer-2 lane of a session (issue 12, phase 1; docs/protocol.md "The layer-2
//! lane"): small requests and replies ride layer-2 commands, a read's data a layer-2
//! transfer into the client's receive slot; everything else stays on TCP.
//!
//! [`L2Port`] is the interface: zcfs's XDP program, a data socket on
//! [`DATA_QUEUE`] whose UMEM is the volume image's mapping (plus a staging area behind
//! it) and a command socket on [`CMD_QUEUE`] with its own region. One service thread
//! runs the [`Endpoint`]. Phase 1 serves ONE layer-2 peer per interface at a time: the
//! data queue's fill ring is shared by every sender, so a second session's `L2Setup` is
//! refused "busy" (it stays on TCP) until the owning connection ends.
//!
//! A request command is executed in the session that set the lane up, through the same
//! [`Lane`] as a TCP request of that connection (peer rule, identity mapping, handles,
//! reply cache), and answered by a reply command. A read's bytes are copied from the
//! volume into a staging slot of the data region and sent from there (the endpoint
//! builds each frame in its TX scratch: a second copy; sending straight from the
//! volume's blocks needs their offsets in the image, which the backend does not hand
//! out yet). A write's data rides inline, in the request's commands: up to
//! `zcfs_protocol::l2::MAX_WRITE` bytes, in parts when longer than one command (one
//! round trip, and commands are delivered in order, once, by the endpoint); larger
//! writes stay on TCP. Landing a large write's data in the volume's blocks in place
//! needs the volume's reservation of blocks with a free front
//! (`Volume::reserve_write_landing`) and a second round trip for the grant (the seam: a
//! request command naming a client transfer for a write).

use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use zcfs_backend::Error;
use zcfs_backend::LandingWrite;
use zcfs_l2::endpoint::{CMD_CHUNK, CMD_REGION_LEN};
use zcfs_l2::{Config, Endpoint, Event, Extent, BLOCK_SIZE, MAX_COMMAND, MAX_EXTENT_BLOCKS};
use zcfs_protocol::l2::{
    blocks_spanned, decode_request, encode_reply, encode_resend_tcp, encode_send_data,
    tag_key_material, L2Request, Reassembly, MAX_LANDING_EXTENTS, MAX_LANDING_WRITE,
};
use zcfs_protocol::{
    mac_from_u64, mac_to_u64, Blob, L2SetupReply, L2SetupReq, Reply, ReqHeader, Request,
    RespHeader, WriteReply, WriteReq, L2_NONCE_LEN, MAX_BODY, OP_SLOTS, RESP_HDR,
};
use zcfs_xsk::{
    bind_retrying, mac_address, BindMode, Region, RegionError, XdpProgram, XskConfig, XskError,
    XskSocket,
};

use crate::conn::Lane;
use crate::session::{lock, Access, Begin, Session};
use crate::{PeerRule, Shared};

/// The queue commands travel on (both ends).
pub const CMD_QUEUE: u32 = 0;
/// The queue data frames travel on (both ends).
pub const DATA_QUEUE: u32 = 1;
/// Chunks of the data region's TX scratch (frames being sent).
pub const TX_CHUNKS: u32 = 1024;
/// Read staging slots of the server (reads in flight on the lane at once).
pub const READ_SLOTS: u32 = 64;
/// The most bytes one read over layer 2 carries: one extent.
pub const MAX_L2_READ: u32 = zcfs_protocol::l2::MAX_READ;
const _: () = assert!(MAX_L2_READ == MAX_EXTENT_BLOCKS * BLOCK_SIZE as u32);
/// Landing writes the server holds at once (waiting for their data, or aborted and
/// waiting until no receive entry points into their blocks): what one lane owner can
/// keep reserved in the volume is bounded by this many writes of `MAX_LANDING_WRITE`
/// bytes and their gaps, even an owner that never sends the data and then leaves (its
/// entries are consumed only by the next owner's drain). More go on TCP.
pub const MAX_PENDING_LANDINGS: usize = 16;
/// Retransmission timeout of the lane's endpoints.
pub const RTO: Duration = Duration::from_millis(5);
/// Quiet time after a drain.
pub const QUIET: Duration = Duration::from_millis(1);
/// A transfer without progress for this long is given up.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the service thread sleeps in `FrameIo::wait` at most (wait mode).
const WAIT_SLICE: Duration = Duration::from_millis(1);

/// How a waiter on the lane waits for frames (shared with the other side).
pub use zcfs_l2::L2Poll;

#[derive(Debug, thiserror::Error)]
pub enum L2PortError {
    #[error(transparent)]
    Xsk(#[from] XskError),
    #[error(transparent)]
    Region(#[from] RegionError),
    #[error("the layer-2 endpoint: {0}")]
    Endpoint(#[from] zcfs_l2::L2Error),
}

/// Layout of the server's data region behind the image.
fn scratch_offset(file_len: usize) -> u64 {
    file_len as u64
}
fn slot_offset(file_len: usize, i: u32) -> u64 {
    // The slots after the scratch; each slot's extent is sent from, so no front is
    // needed.
    file_len as u64 + TX_CHUNKS as u64 * CMD_CHUNK + i as u64 * MAX_L2_READ as u64
}
fn staging_len() -> usize {
    TX_CHUNKS as usize * CMD_CHUNK as usize + READ_SLOTS as usize * MAX_L2_READ as usize + 4096
}

/// An interface opened for the layer-2 lane.
pub struct L2Port {
    ifname: String,
    mac: [u8; 6],
    mode: BindMode,
    ep: Endpoint<XskSocket, XskSocket>,
    /// The data socket's region (the endpoint's `data().region()`, held to write
    /// staging slots while the endpoint is borrowed).
    region: Arc<Region>,
    file_len: usize,
    /// (device, inode) of the image the data socket's UMEM maps: writes land in place
    /// only when it is the backend's own image (`Backend::image_file_id`).
    image_id: Option<(u64, u64)>,
    /// How the sockets were bound (the data socket is made again with it).
    xsk: XskConfig,
    // Last: the program detaches after the sockets closed.
    prog: XdpProgram,
}

impl L2Port {
    /// Open `ifname` (in this thread's network namespace) for the lane, the data
    /// socket's UMEM the mapping of `image` (tmpfs, hugetlbfs or device-dax, else
    /// [`RegionError::UnsupportedBacking`]).
    pub fn open(ifname: &str, image: &File, poll: L2Poll) -> Result<L2Port, L2PortError> {
        let image_id = {
            use std::os::unix::fs::MetadataExt;
            image.metadata().ok().map(|m| (m.dev(), m.ino()))
        };
        let region = Arc::new(Region::map_file(image, staging_len())?);
        let file_len = region.file_len();
        let mac = mac_address(ifname)?;
        let mut prog = XdpProgram::attach(ifname)?;
        let cfg = XskConfig {
            busy_poll: poll == L2Poll::Busy,
            ..XskConfig::default()
        };
        let cmd_region = Arc::new(Region::anonymous(CMD_REGION_LEN)?);
        let data = bind_retrying(|| XskSocket::new(region.clone(), ifname, DATA_QUEUE, cfg))?;
        let cmd = bind_retrying(|| XskSocket::new(cmd_region.clone(), ifname, CMD_QUEUE, cfg))?;
        prog.register(DATA_QUEUE, &data)?;
        prog.register(CMD_QUEUE, &cmd)?;
        let mode = data.mode();
        let ep = Endpoint::new(
            endpoint_config(mac, [0; 6], scratch_offset(file_len)),
            &rand::random::<[u8; 32]>(),
            data,
            cmd,
        )?;
        Ok(L2Port {
            ifname: ifname.to_string(),
            mac,
            mode,
            ep,
            region,
            file_len,
            image_id,
            xsk: cfg,
            prog,
        })
    }

    pub fn mode(&self) -> BindMode {
        self.mode
    }

    /// Close the data socket and bind a new one on the same queue and memory, so no
    /// receive entry posted for a lane owner that left points into the volume any more
    /// (`Endpoint::replace_data`). Binding succeeds only once the old socket's buffer
    /// pool has left the queue (EBUSY until then: `bind_retrying`), so after it
    /// returns no frame, copied or DMAed, reaches the old entries. Err: the lane has no
    /// data socket any more.
    fn reopen_data(&mut self) -> Result<(), L2PortError> {
        let (region, ifname, cfg) = (self.region.clone(), self.ifname.clone(), self.xsk);
        self.ep.replace_data(|| {
            bind_retrying(|| XskSocket::new(region.clone(), &ifname, DATA_QUEUE, cfg))
                .map_err(L2PortError::from)
        })?;
        if let Some(data) = self.ep.data() {
            self.prog.register(DATA_QUEUE, data)?;
            if data.mode() != self.mode {
                tracing::warn!(ifname = %self.ifname, was = ?self.mode, now = ?data.mode(), "the layer-2 data socket was bound again in another mode");
                self.mode = data.mode();
            }
        }
        Ok(())
    }
}

/// The endpoint settings both ends of the lane use.
pub fn endpoint_config(local: [u8; 6], peer: [u8; 6], scratch: u64) -> Config {
    Config {
        local_mac: local,
        peer_mac: peer,
        rto_ns: RTO.as_nanos() as u64,
        quiet_ns: QUIET.as_nanos() as u64,
        transfer_timeout_ns: TRANSFER_TIMEOUT.as_nanos() as u64,
        credit_frames: zcfs_l2::endpoint::MAX_CREDIT_FRAMES,
        tx_scratch: (scratch, TX_CHUNKS),
        open_tags: false,
    }
}

/// The session holding the interface.
struct Owner {
    generation: u64,
    session: Arc<Session>,
    rule: PeerRule,
    peer_mac: [u8; 6],
    key: Vec<u8>,
    /// No shared secret: the key is known to whoever saw the set-up (frame tags cover a
    /// keyed SipHash of the payload, `zcfs_l2::TagKey::derive_open`).
    open_tags: bool,
}

/// Who holds the interface, and whose lane request runs now (one at a time, on the
/// service thread). One lock for both, held for these fields only (never across a
/// request or a frame): the service thread checks the owner and marks its request
/// running in one step, and the fence gives the lane up and sees whether a request
/// of the session still runs in one step.
#[derive(Default)]
struct Tenancy {
    owner: Option<Owner>,
    /// The session whose lane request runs now.
    running: Option<Arc<Session>>,
    /// Fences waiting in `L2Service::wait_quiet` (a notify is a system call even with
    /// no one waiting, and every lane request ends with one otherwise).
    quiet_waiters: usize,
}

/// Marks the service thread's current request as running until dropped (a panic
/// included), then wakes the fences waiting for it.
struct Running<'a>(&'a L2Service);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.0.state);
        st.running = None;
        if st.quiet_waiters > 0 {
            self.0.idle.notify_all();
        }
    }
}

/// Counters of the lane (the server's `zcfs stat`).
pub struct L2Counters {
    /// Requests executed from layer-2 commands, per operation code.
    pub requests: [AtomicU64; OP_SLOTS],
    /// Commands that did not decode (dropped).
    pub malformed: AtomicU64,
    /// Replies too large for a command (the client resent them on TCP).
    pub resend_tcp: AtomicU64,
    /// L2Setups accepted and refused.
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
}

/// The lane's state shared by the connections and the service thread.
pub(crate) struct L2Service {
    pub ifname: String,
    pub mac: [u8; 6],
    /// Bound zero-copy (else copy); it may change when the data socket is made again.
    zero_copy: AtomicBool,
    /// The most bytes of a write that lands in place (0: writes do not land: the
    /// lane's memory does not map the backend's image).
    pub land_max: u32,
    state: Mutex<Tenancy>,
    /// Signalled when a lane request ends (`Tenancy::running` cleared).
    idle: Condvar,
    next_generation: AtomicU64,
    pub counters: L2Counters,
    stop: AtomicBool,
    /// The stats' view: poll mode, whether the service thread runs, and the last
    /// refusal or failure.
    poll: L2Poll,
    running: AtomicBool,
    reason: Mutex<String>,
}

/// How long a connection's end waits for a lane request of its session that still runs
/// (`Hold`'s drop): its session may be released right after, and a request running
/// against a released session would leak what it creates.
pub const HOLD_QUIET_WAIT: Duration = Duration::from_secs(30);

/// A connection's hold of the interface: given back when the connection ends, which
/// then waits (at most `HOLD_QUIET_WAIT`) until no lane request of its session runs.
pub(crate) struct Hold {
    service: Arc<L2Service>,
    generation: u64,
    /// The session it was taken for (None: replaced by a newer hold of the same
    /// connection, which waits instead).
    session: Option<Arc<Session>>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut st = lock(&self.service.state);
        if st
            .owner
            .as_ref()
            .is_some_and(|o| o.generation == self.generation)
        {
            st.owner = None;
            tracing::info!(ifname = %self.service.ifname, "layer-2 lane released");
        }
        drop(st);
        // Whether or not it still owned the lane (a fence may have given it up): a
        // request of its session may run now (review finding: sessions were released
        // under a running lane request at shutdown).
        if let Some(session) = &self.session {
            let until = Instant::now() + HOLD_QUIET_WAIT;
            if !self.service.wait_quiet(session, until) {
                tracing::warn!(
                    ifname = %self.service.ifname,
                    "a layer-2 request still runs {HOLD_QUIET_WAIT:?} after its connection ended"
                );
            }
        }
    }
}

impl L2Service {
    pub fn mode(&self) -> BindMode {
        if self.zero_copy.load(Ordering::Relaxed) {
            BindMode::ZeroCopy
        } else {
            BindMode::Copy
        }
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.running.store(false, Ordering::SeqCst);
    }

    /// The lane for the stats: up while its thread serves; requests per operation on
    /// each path (TCP from the server's counters).
    pub(crate) fn report(&self, stats: &crate::stats::ServerStats) -> zcfs_metrics::LaneReport {
        let mut r = zcfs_metrics::LaneReport {
            iface: self.ifname.clone(),
            bind_mode: match self.mode() {
                BindMode::Copy => "copy",
                BindMode::ZeroCopy => "zero-copy",
            }
            .into(),
            poll: match self.poll {
                L2Poll::Busy => "busy",
                L2Poll::Wait => "wait",
            }
            .into(),
            up: self.running.load(Ordering::SeqCst),
            reason: lock(&self.reason).clone(),
            ..Default::default()
        };
        for op in zcfs_protocol::ALL_OPS {
            let c = zcfs_metrics::PathCounts {
                l2: self.counters.requests[*op as usize].load(Ordering::Relaxed),
                tcp: stats.tcp_requests[*op as usize].load(Ordering::Relaxed),
            };
            if c.l2 + c.tcp > 0 {
                r.requests.insert(op.name().into(), c);
            }
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (name, v) in [
            ("accepted", load(&self.counters.accepted)),
            ("refused", load(&self.counters.refused)),
            ("malformed", load(&self.counters.malformed)),
            ("resend_tcp", load(&self.counters.resend_tcp)),
        ] {
            r.counters.insert(name.into(), v);
        }
        r
    }

    /// The fence of `L2Release`: the lane is `session`'s no more (from now on the
    /// service thread drops the session's lane requests, so a request the client sends
    /// again on TCP cannot also run late from the lane). Returns whether no lane
    /// request of the session runs now; if one does, the fence is answered once it
    /// ended (`wait_quiet`), without blocking the connection it came by.
    pub fn release(&self, session: &Session) -> bool {
        let mut st = lock(&self.state);
        if st
            .owner
            .as_ref()
            .is_some_and(|o| std::ptr::eq(&*o.session, session))
        {
            st.owner = None;
            tracing::info!(ifname = %self.ifname, "layer-2 lane released by its session");
        }
        // Whether or not the session still owned the lane: one released earlier (its
        // connection ended, an earlier fence) may still be running a request.
        !st.running
            .as_ref()
            .is_some_and(|s| std::ptr::eq(&**s, session))
    }

    /// Wait until no lane request of `session` runs, at most until `until`; whether
    /// none does.
    pub fn wait_quiet(&self, session: &Session, until: Instant) -> bool {
        let mut st = lock(&self.state);
        loop {
            if !st
                .running
                .as_ref()
                .is_some_and(|s| std::ptr::eq(&**s, session))
            {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            st.quiet_waiters += 1;
            st = self
                .idle
                .wait_timeout(st, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            st.quiet_waiters -= 1;
        }
    }

    /// Answer an `L2Setup` from a connection of `session`: take the interface if it is
    /// free (`hold` keeps it for the connection) or refuse.
    pub fn setup(
        self: &Arc<L2Service>,
        secret: Option<&[u8]>,
        session: Arc<Session>,
        rule: PeerRule,
        req: &L2SetupReq,
        hold: &mut Option<Hold>,
    ) -> L2SetupReply {
        let refuse = |why: String| {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            // A busy refusal begins with BUSY_REASON (the client offers again later);
            // it names the interface itself.
            let why = if why.starts_with(zcfs_protocol::l2::BUSY_REASON) {
                why
            } else {
                format!("{}: {why}", self.ifname)
            };
            *lock(&self.reason) = format!("refused {why}");
            refusal(&why)
        };
        if req.cmd_queue != CMD_QUEUE || req.data_queue != DATA_QUEUE {
            return refuse(format!(
                "queues (command {}, data {}) differ from the server's ({CMD_QUEUE}, {DATA_QUEUE})",
                req.cmd_queue, req.data_queue
            ));
        }
        if !self.running.load(Ordering::SeqCst) {
            // Not through `refuse`: the reason the lane stopped stays the one reported.
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return refusal(&format!(
                "{}: the lane is stopped ({})",
                self.ifname,
                lock(&self.reason)
            ));
        }
        let mut st = lock(&self.state);
        if let Some(cur) = st.owner.as_ref() {
            if hold.as_ref().is_none_or(|h| h.generation != cur.generation) {
                return refuse(format!(
                    "{}: {} serves another session",
                    zcfs_protocol::l2::BUSY_REASON,
                    self.ifname
                ));
            }
        }
        let nonce: [u8; L2_NONCE_LEN] = rand::random();
        let generation = self.next_generation.fetch_add(1, Ordering::SeqCst) + 1;
        st.owner = Some(Owner {
            generation,
            session: session.clone(),
            rule,
            peer_mac: mac_from_u64(req.mac),
            key: tag_key_material(secret, &nonce),
            open_tags: secret.is_none(),
        });
        drop(st);
        // A repeated setup on the same connection replaces its own hold.
        let old = hold.replace(Hold {
            service: self.clone(),
            generation,
            session: Some(session),
        });
        if let Some(mut old) = old {
            old.generation = 0;
            old.session = None;
        }
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        tracing::info!(ifname = %self.ifname, mode = ?self.mode(), "layer-2 lane accepted");
        L2SetupReply {
            accepted: true,
            mac: mac_to_u64(self.mac),
            cmd_queue: CMD_QUEUE,
            data_queue: DATA_QUEUE,
            land_max: self.land_max,
            nonce: Blob::new(nonce.to_vec()).expect("32 bytes"),
            reason: Blob::new(Vec::new()).expect("empty"),
        }
    }
}

/// A refusal of the lane, logged (one line: the session stays on TCP).
pub(crate) fn refusal(why: &str) -> L2SetupReply {
    let mut why = why.as_bytes().to_vec();
    why.truncate(zcfs_protocol::L2_MAX_REASON);
    let why = String::from_utf8_lossy(&why).into_owned();
    tracing::info!("layer-2 lane refused, the session stays on TCP: {why}");
    L2SetupReply {
        accepted: false,
        mac: 0,
        cmd_queue: 0,
        data_queue: 0,
        land_max: 0,
        nonce: Blob::new(Vec::new()).expect("empty"),
        reason: Blob::new(why.into_bytes()).expect("bounded reason"),
    }
}

/// Start the service thread of `port` for the server's `shared` state.
pub(crate) fn start(
    port: L2Port,
    shared: Arc<Shared>,
    poll: L2Poll,
) -> std::io::Result<Arc<L2Service>> {
    let backend_image = shared.backend.image_file_id();
    let lands = backend_image.is_some() && backend_image == port.image_id;
    if !lands {
        tracing::info!(
            ifname = %port.ifname,
            "layer-2 writes do not land in place: the lane's memory does not map the volume's image"
        );
    }
    let service = Arc::new(L2Service {
        ifname: port.ifname.clone(),
        mac: port.mac,
        zero_copy: AtomicBool::new(port.mode == BindMode::ZeroCopy),
        land_max: if lands { MAX_LANDING_WRITE } else { 0 },
        state: Mutex::new(Tenancy::default()),
        idle: Condvar::new(),
        next_generation: AtomicU64::new(0),
        counters: L2Counters {
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            malformed: AtomicU64::new(0),
            resend_tcp: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        },
        stop: AtomicBool::new(false),
        poll,
        running: AtomicBool::new(true),
        reason: Mutex::new(String::new()),
    });
    let s = service.clone();
    let busy = poll == L2Poll::Busy;
    std::thread::Builder::new()
        .name("zcfs-l2".into())
        .spawn(move || run(port, &shared, &s, busy))?;
    Ok(service)
}

/// A landing write waiting for its transfer: the blocks that will keep its bytes are
/// reserved and posted to the kernel as the transfer's receive entries.
struct Landing {
    /// The owner generation it was accepted for: committed only while that owner
    /// holds the lane (a fence or a new owner since: never).
    generation: u64,
    header: ReqHeader,
    write: WriteReq,
    bfh: u64,
    res: Box<dyn LandingWrite>,
    /// The node's generation check, held until the landing ends (a write without a
    /// handle that vouches for it).
    _held: Option<crate::dispatch::HeldOwned>,
    started: Instant,
}

/// What the service thread keeps between polls.
struct Run {
    // First: dropped first, so the kernel writes into no reservation below after it
    // went back to the allocator (the sockets close before `landings` drops).
    port: L2Port,
    /// Landing writes by transfer id: waiting for their data (`Event::Committed`), or
    /// aborted and waiting for their receive entries to be consumed
    /// (`Event::SlotsFree`) before their blocks go back.
    landings: std::collections::HashMap<u32, Landing>,
    generation: u64,
    free_slots: Vec<u32>,
    /// Transfer id -> the staging slot it is sent from.
    sending: std::collections::HashMap<u32, u32>,
    /// The parts of a request longer than one command gathered so far (the owner's).
    parts: Reassembly,
    /// Writes land in place: the UMEM maps the backend's own image.
    lands: bool,
}

fn run(port: L2Port, shared: &Shared, service: &L2Service, busy: bool) {
    let t0 = Instant::now();
    let mut r = Run {
        port,
        lands: service.land_max > 0,
        landings: std::collections::HashMap::new(),
        generation: 0,
        free_slots: (0..READ_SLOTS).rev().collect(),
        sending: std::collections::HashMap::new(),
        parts: Reassembly::default(),
    };
    // Polls in a row with frames to send and none sent (MAX_IDLE_TX_POLLS).
    let mut idle_tx = 0u32;
    while !service.stop.load(Ordering::SeqCst) {
        // A new owner (or none): new key and peer; the old session's transfers end.
        {
            let st = lock(&service.state);
            let g = st.owner.as_ref().map_or(0, |o| o.generation);
            if g != r.generation {
                r.generation = g;
                r.parts.clear();
                match st.owner.as_ref() {
                    Some(o) => r.port.ep.rekey_peer(&o.key, o.peer_mac, o.open_tags),
                    None => r
                        .port
                        .ep
                        .rekey_peer(&rand::random::<[u8; 32]>(), [0; 6], false),
                }
                // No owner, and landings (aborted by the rekey) whose entries stay
                // posted until a peer drains them: with no peer, the blocks would stay
                // reserved until a next owner or a restart (review 28). A new data
                // socket takes the entries back.
                if st.owner.is_none() && !r.landings.is_empty() {
                    drop(st);
                    tracing::info!(
                        ifname = %service.ifname,
                        landings = r.landings.len(),
                        "layer-2 lane left with landing writes posted: its data socket is made again"
                    );
                    let reopened = r.port.reopen_data();
                    service
                        .zero_copy
                        .store(r.port.mode() == BindMode::ZeroCopy, Ordering::Relaxed);
                    if let Err(e) = reopened {
                        tracing::error!(ifname = %service.ifname, "layer-2 data socket not made again, lane stopped: {e}");
                        *lock(&service.reason) =
                            format!("the data socket could not be made again: {e}");
                        service.running.store(false, Ordering::SeqCst);
                        lock(&service.state).owner = None;
                        return;
                    }
                }
            }
        };
        let sent_before = r.port.ep.tx_frames();
        let events = match r.port.ep.poll(t0.elapsed().as_nanos() as u64) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(ifname = %service.ifname, "layer-2 endpoint failed, lane stopped: {e}");
                *lock(&service.reason) = format!("the endpoint failed: {e}");
                service.running.store(false, Ordering::SeqCst);
                lock(&service.state).owner = None;
                return;
            }
        };
        let idle = events.is_empty();
        idle_tx = if r.port.ep.tx_frames() != sent_before || !r.port.ep.tx_pending() {
            0
        } else {
            idle_tx + 1
        };
        for ev in events {
            match ev {
                Event::Command(bytes) => {
                    // A request in parts is executed when its last part is in.
                    let bytes = match r.parts.take(bytes) {
                        Ok(Some(whole)) => whole,
                        Ok(None) => continue,
                        Err(e) => {
                            service.counters.malformed.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(ifname = %service.ifname, "layer-2 request parts dropped: {e}");
                            continue;
                        }
                    };
                    // Executed only for the owner the endpoint is keyed for, marked
                    // running in the same step: `L2Service::release` (the fence) waits
                    // for a request running now and none of the session runs after it.
                    let taken = {
                        let mut st = lock(&service.state);
                        let o = st.owner.as_ref().filter(|o| o.generation == r.generation);
                        let taken = o.map(|o| (o.session.clone(), o.rule.clone()));
                        if let Some((session, _)) = &taken {
                            st.running = Some(session.clone());
                        }
                        taken
                    };
                    match taken {
                        Some((session, rule)) => {
                            let _running = Running(service);
                            let lane = Lane {
                                rule,
                                shared,
                                session: &session,
                            };
                            command(&mut r, &lane, service, &bytes);
                        }
                        None => {
                            service.counters.malformed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Event::Delivered(id) | Event::Failed(id) => {
                    if let Some(slot) = r.sending.remove(&id) {
                        r.free_slots.push(slot);
                    }
                }
                Event::Committed(x) => landed(&mut r, shared, service, x),
                Event::Aborted(x) => {
                    // Its blocks stay reserved until no receive entry points into
                    // them (SlotsFree). Nothing of it was written, so the client may
                    // send it on TCP now, if its session still holds the lane.
                    let own = r.landings.get(&x).filter(|l| l.generation == r.generation);
                    if let Some(id) = own.map(|l| l.header.id) {
                        tracing::debug!(ifname = %service.ifname, xfer = x, "landing write aborted: resent on TCP");
                        if let Err(e) = r.port.ep.send_command(&encode_resend_tcp(id)) {
                            tracing::warn!("layer-2 resend-on-TCP dropped: {e}");
                        }
                    }
                }
                Event::SlotsFree(x) => {
                    // Nothing writes into its blocks any more: they go back.
                    r.landings.remove(&x);
                }
            }
        }
        if idle {
            if busy {
                std::hint::spin_loop();
            } else if r.port.ep.tx_pending() && idle_tx <= zcfs_l2::MAX_IDLE_TX_POLLS {
                // A read's frames wait for TX chunks: no socket wakes a sleeper for that
                // (bounded: a link that went down never gives them back).
                std::thread::yield_now();
            } else if r.landings.is_empty() {
                let _ = r.port.ep.wait_command(WAIT_SLICE);
            } else {
                // Receiving: a landing write's data frames wake it too (on the command
                // queue alone, frames that came while it slept waited up to WAIT_SLICE
                // to be taken).
                wait_both(&r.port.ep);
            }
        }
    }
}

/// Sleep until a frame arrives on either queue, or `WAIT_SLICE` passed (called right
/// after a poll that found nothing, so nothing waits in the rings).
fn wait_both(ep: &Endpoint<XskSocket, XskSocket>) {
    use std::os::fd::AsRawFd;
    let data = ep.data().map_or(-1, |d| d.as_raw_fd());
    let mut pfd = [ep.cmd().as_raw_fd(), data].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: two valid pollfds of sockets the endpoint holds for the call's length.
    unsafe { libc::poll(pfd.as_mut_ptr(), 2, WAIT_SLICE.as_millis() as i32) };
}

/// Send an encoded reply (header and body) as a command, or "resend on TCP" when it
/// does not fit one.
fn answer(r: &mut Run, service: &L2Service, id: u64, msg: &[u8]) {
    let c = if zcfs_protocol::l2::REPLY_PREFIX + msg.len() <= MAX_COMMAND {
        encode_reply(msg)
    } else {
        service.counters.resend_tcp.fetch_add(1, Ordering::Relaxed);
        encode_resend_tcp(id)
    };
    if let Err(e) = r.port.ep.send_command(&c) {
        tracing::warn!(ifname = %service.ifname, "layer-2 reply dropped: {e}");
    }
}

fn encode(h: &ReqHeader, r: Result<Reply, Error>, data_len: u32) -> Vec<u8> {
    let (rh, body) = match r.map(|rep| rep.encode()) {
        Ok(body) if body.len() <= MAX_BODY => (
            RespHeader::ok(h.op, h.id, body.len() as u32, data_len),
            body,
        ),
        Ok(_) => (RespHeader::error(h.op, h.id, libc::EIO), Vec::new()),
        Err(e) => (RespHeader::error(h.op, h.id, e.errno), Vec::new()),
    };
    let mut msg = Vec::with_capacity(RESP_HDR + body.len());
    msg.extend_from_slice(&rh.encode());
    msg.extend_from_slice(&body);
    msg
}

/// One request command, executed in the owning session and answered.
fn command(r: &mut Run, lane: &Lane<'_>, service: &L2Service, bytes: &[u8]) {
    let req = match decode_request(bytes) {
        Ok(q) => q,
        Err(e) => {
            service.counters.malformed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(ifname = %service.ifname, "malformed layer-2 command dropped: {e}");
            return;
        }
    };
    let h = req.header;
    service.counters.requests[h.op as usize].fetch_add(1, Ordering::Relaxed);
    let t = Instant::now();
    let res = catch_unwind(AssertUnwindSafe(|| execute(r, lane, &req, t)));
    let msg = match res {
        Ok(m) => m,
        Err(_) => {
            lane.shared.stats.panics.fetch_add(1, Ordering::Relaxed);
            lane.shared.stats.record(h.op, false, 0, t);
            Some(encode(
                &h,
                Err(Error::new(libc::EIO, "the server failed this request")),
                0,
            ))
        }
    };
    if let Some(msg) = msg {
        answer(r, service, h.id, &msg);
    }
}

/// Execute one request; the encoded reply (None: answered already).
fn execute(r: &mut Run, lane: &Lane<'_>, q: &L2Request<'_>, t: Instant) -> Option<Vec<u8>> {
    if q.landing {
        return land(r, lane, q, t);
    }
    let h = &q.header;
    let stats = &lane.shared.stats;
    let (req, groups) = match Request::decode_with_groups(h, q.body) {
        Ok(x) => x,
        Err(e) => {
            stats.rejected_invalid.fetch_add(1, Ordering::Relaxed);
            stats.record(h.op, false, 0, t);
            if q.xfer != 0 {
                send_zeros(r, q);
            }
            return Some(encode(h, Err(Error::new(e.errno(), e.to_string())), 0));
        }
    };
    let mut claim = None;
    if h.op.cached() {
        match lane.session.begin_until(h.id, h.op, Instant::now()) {
            Some(Begin::Replay(reply)) => {
                stats.replies_replayed.fetch_add(1, Ordering::Relaxed);
                return Some(reply.to_vec());
            }
            Some(Begin::Run(c)) => claim = Some(c),
            // Its resend on TCP runs now: the client sends one only after it gave this
            // copy up, so no one waits for this answer. Dropped, rather than waited for
            // on the service thread, which every lane request needs.
            None => {
                tracing::debug!(
                    op = h.op.name(),
                    id = h.id,
                    "layer-2 copy of a request running on TCP dropped"
                );
                return None;
            }
        }
    }
    let ctx = lane.caller(h, groups);
    let (result, data_len, bytes) = match (ctx, req) {
        (Err(e), _) => {
            if q.xfer != 0 {
                send_zeros(r, q);
            }
            (Err(e), 0, 0)
        }
        (Ok(_), Request::Read(_)) if r.free_slots.is_empty() => {
            // Every staging slot is sending: the client reads it on TCP (same id; a
            // read may run twice) rather than failing with EAGAIN.
            if let Err(e) = r.port.ep.send_command(&encode_resend_tcp(h.id)) {
                tracing::warn!("layer-2 resend-on-TCP dropped: {e}");
            }
            return None;
        }
        (Ok(ctx), Request::Read(rd)) => read(r, lane, &ctx, q, rd),
        (Ok(ctx), Request::Write(w)) => {
            let res = if lane.shared.cfg.read_only {
                Err(crate::conn::ro())
            } else {
                lane.resolve_held(&ctx, w.node, w.fh, Access::Write)
                    .map(|(bfh, held)| {
                        let n = lane
                            .shared
                            .backend
                            .write(&ctx, w.node.ino, bfh, w.offset, q.data);
                        let committed = crate::conn::commit_if_asked(lane.shared, &w, bfh, &n);
                        drop(held);
                        n.map(|written| (written, committed))
                    })
                    .and_then(|r| r)
            };
            let n = res.as_ref().map_or(0, |(n, _)| *n) as u64;
            (
                res.map(|(written, committed)| Reply::Write(WriteReply { written, committed })),
                0,
                n,
            )
        }
        (Ok(_), Request::L2Setup(_)) => (
            Err(Error::new(libc::EINVAL, "l2setup travels on TCP")),
            0,
            0,
        ),
        (Ok(ctx), other) => (lane.dispatch(&ctx, other), 0, 0),
    };
    stats.record(h.op, result.is_ok(), bytes, t);
    let msg = encode(h, result, data_len);
    if let Some(c) = claim {
        c.finish(msg.clone().into());
    }
    Some(msg)
}

/// A landing write (`KIND_LANDING_WRITE`): check it as a write, reserve the blocks
/// that will keep its bytes, post them as a transfer and tell the client to send
/// ("send data"). Answered later (`landed`); now only when it fails or goes on TCP
/// instead (no room laid out for landing, a handle that does not vouch for the
/// file's generation, no transfer to be had).
fn land(r: &mut Run, lane: &Lane<'_>, q: &L2Request<'_>, t: Instant) -> Option<Vec<u8>> {
    let h = &q.header;
    let stats = &lane.shared.stats;
    let fail = |e: Error| {
        stats.record(h.op, false, 0, t);
        Some(encode(h, Err(e), 0))
    };
    let resend = |r: &mut Run, why: &str| {
        tracing::debug!(id = h.id, "landing write goes on TCP: {why}");
        if let Err(e) = r.port.ep.send_command(&encode_resend_tcp(h.id)) {
            tracing::warn!("layer-2 resend-on-TCP dropped: {e}");
        }
        None
    };
    let (w, groups) = match Request::decode_with_groups(h, q.body) {
        Ok((Request::Write(w), g)) => (w, g),
        Ok(_) => {
            return fail(Error::new(
                libc::EINVAL,
                "a landing write that is not a write",
            ))
        }
        Err(e) => {
            stats.rejected_invalid.fetch_add(1, Ordering::Relaxed);
            return fail(Error::new(e.errno(), e.to_string()));
        }
    };
    if w.size == 0 || w.size > MAX_LANDING_WRITE || blocks_spanned(w.offset, w.size) != q.blocks {
        stats.rejected_invalid.fetch_add(1, Ordering::Relaxed);
        return fail(Error::new(
            libc::EINVAL,
            format!("a landing write of 1..={MAX_LANDING_WRITE} bytes names the blocks it spans"),
        ));
    }
    if lane.shared.cfg.read_only {
        return fail(crate::conn::ro());
    }
    let ctx = match lane.caller(h, groups) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if !r.lands {
        return resend(r, "the lane's memory is not the volume's image");
    }
    if r.landings.len() >= MAX_PENDING_LANDINGS {
        return resend(r, "as many landing writes held as the lane takes");
    }
    // Without a handle that vouches for the file's generation, the node is checked and
    // held (as a TCP write holds it) until the landing ends.
    let (bfh, held) = match lane.resolve(&ctx, w.node, w.fh, Access::Write) {
        Ok((bfh, false)) => (bfh, None),
        Ok((bfh, true)) => match lane.hold_owned(w.node) {
            Ok(h) => (bfh, h),
            Err(e) => return fail(e),
        },
        Err(e) => return fail(e),
    };
    let res =
        match lane
            .shared
            .backend
            .reserve_landing(&ctx, w.node.ino, bfh, w.offset, w.size as usize)
        {
            Ok(res) => res,
            Err(e) if e.errno == libc::ENOSPC || e.errno == libc::ENOTSUP => {
                return resend(r, &e.msg())
            }
            Err(e) => return fail(e),
        };
    let spans = res.extents();
    let total: u64 = spans.iter().map(|e| e.blocks as u64).sum();
    if spans.is_empty()
        || spans.len() > MAX_LANDING_EXTENTS
        || total != q.blocks as u64
        || spans
            .iter()
            .any(|e| e.blocks == 0 || e.blocks > MAX_EXTENT_BLOCKS)
    {
        // The store laid it out in more pieces than a transfer carries.
        return resend(r, "the reservation's extents do not fit one transfer");
    }
    let extents: Vec<Extent> = spans
        .iter()
        .map(|e| Extent {
            offset: e.offset,
            blocks: e.blocks,
        })
        .collect();
    let sizes: Vec<u16> = spans.iter().map(|e| e.blocks as u16).collect();
    let xfer = match r.port.ep.expect(&extents) {
        Ok(x) => x,
        // Nothing was posted: the reservation goes back as it drops.
        Err(e) => return resend(r, &e.to_string()),
    };
    r.landings.insert(
        xfer,
        Landing {
            generation: r.generation,
            header: *h,
            write: w,
            bfh,
            res,
            _held: held,
            started: t,
        },
    );
    if let Err(e) = r
        .port
        .ep
        .send_command(&encode_send_data(h.id, xfer, &sizes))
    {
        // The client hears nothing and its request times out; the transfer is
        // aborted when no data comes, and its blocks go back at SlotsFree.
        tracing::warn!("layer-2 send-data dropped: {e}");
    }
    None
}

/// Landing write `xfer`'s bytes all arrived and passed their checks: commit them, as
/// the session's request (marked running, so the fence waits for it), if the session
/// that sent it still holds the lane; else they are dropped unwritten.
fn landed(r: &mut Run, shared: &Shared, service: &L2Service, xfer: u32) {
    let Some(l) = r.landings.remove(&xfer) else {
        return;
    };
    let taken = {
        let mut st = lock(&service.state);
        let o = st
            .owner
            .as_ref()
            .filter(|o| o.generation == l.generation && o.generation == r.generation);
        let session = o.map(|o| o.session.clone());
        if let Some(session) = &session {
            st.running = Some(session.clone());
        }
        session
    };
    let Some(_session) = taken else {
        tracing::debug!(
            xfer,
            "a landing write of a session that no longer holds the lane dropped"
        );
        return;
    };
    let _running = Running(service);
    let h = l.header;
    let res = catch_unwind(AssertUnwindSafe(|| {
        let n = l.res.commit();
        let committed = crate::conn::commit_if_asked(shared, &l.write, l.bfh, &n);
        n.map(|written| (written, committed))
    }));
    let res = res.unwrap_or_else(|_| {
        shared.stats.panics.fetch_add(1, Ordering::Relaxed);
        Err(Error::new(libc::EIO, "the server failed this request"))
    });
    let n = res.as_ref().map_or(0, |(n, _)| *n) as u64;
    shared.stats.record(h.op, res.is_ok(), n, l.started);
    let reply = res.map(|(written, committed)| Reply::Write(WriteReply { written, committed }));
    let msg = encode(&h, reply, 0);
    answer(r, service, h.id, &msg);
}

/// A transfer the client expects and the server cannot fill: zeros, so the client's
/// slot is committed and free again (rather than held until its transfer times out).
fn send_zeros(r: &mut Run, q: &L2Request<'_>) {
    if q.blocks == 0 || q.blocks > MAX_EXTENT_BLOCKS {
        return;
    }
    let Some(slot) = r.free_slots.pop() else {
        return;
    };
    let off = slot_offset(r.port.file_len, slot);
    let zeros = vec![0u8; q.blocks as usize * BLOCK_SIZE];
    let ok = r.port.region.write(off, &zeros).is_ok()
        && r.port
            .ep
            .send(
                q.xfer,
                &[Extent {
                    offset: off,
                    blocks: q.blocks,
                }],
            )
            .is_ok();
    if ok {
        r.sending.insert(q.xfer, slot);
    } else {
        r.free_slots.push(slot);
    }
}

/// A read: the bytes into a staging slot, sent as the client's transfer.
fn read(
    r: &mut Run,
    lane: &Lane<'_>,
    ctx: &zcfs_backend::Ctx,
    q: &L2Request<'_>,
    rd: zcfs_protocol::ReadReq,
) -> (Result<Reply, Error>, u32, u64) {
    let blocks = q.blocks;
    if q.xfer == 0
        || blocks == 0
        || blocks > MAX_EXTENT_BLOCKS
        || rd.size as u64 > blocks as u64 * BLOCK_SIZE as u64
    {
        send_zeros(r, q);
        return (
            Err(Error::new(
                libc::EINVAL,
                "a layer-2 read needs a transfer of enough blocks (at most one extent)",
            )),
            0,
            0,
        );
    }
    let Some(slot) = r.free_slots.pop() else {
        return (
            Err(Error::new(libc::EAGAIN, "no read staging slot free")),
            0,
            0,
        );
    };
    let off = slot_offset(r.port.file_len, slot);
    let region = r.port.region.clone();
    let mut n = 0usize;
    let res = lane
        .resolve_held(ctx, rd.node, rd.fh, Access::Read)
        .and_then(|(bfh, held)| {
            let x = lane.shared.backend.read(
                rd.node.ino,
                bfh,
                rd.offset,
                rd.size,
                &mut |slices: &[&[u8]]| {
                    let total: usize = slices.iter().map(|s| s.len()).sum();
                    if total > rd.size as usize {
                        return Err(Error::new(libc::EIO, "backend returned more than asked"));
                    }
                    let mut at = off;
                    for s in slices {
                        region
                            .write(at, s)
                            .map_err(|e| Error::new(libc::EIO, e.to_string()))?;
                        at += s.len() as u64;
                    }
                    n = total;
                    Ok(())
                },
            );
            drop(held);
            x
        });
    let len = blocks as usize * BLOCK_SIZE;
    let tail_from = if res.is_ok() { n } else { 0 };
    if tail_from < len {
        let _ = region.write(off + tail_from as u64, &vec![0u8; len - tail_from]);
    }
    match r.port.ep.send(
        q.xfer,
        &[Extent {
            offset: off,
            blocks,
        }],
    ) {
        Ok(()) => {
            r.sending.insert(q.xfer, slot);
        }
        Err(e) => {
            r.free_slots.push(slot);
            return (Err(Error::new(libc::EIO, e.to_string())), 0, 0);
        }
    }
    match res {
        Ok(()) => (
            Ok(Reply::Read(zcfs_protocol::EmptyReply {})),
            n as u32,
            n as u64,
        ),
        Err(e) => (Err(e), 0, 0),
    }
}
