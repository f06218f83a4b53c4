//! Review 28 of landing writes (protocol 13, commit 2e552dc): a layer-2 peer of our own
//! (a session's lane set up by hand, its endpoint driven by the test) against a server
//! whose lane memory is its volume's image, over a two-queue veth pair between two
//! namespaces (root; skipped otherwise unless ZCFS_REQUIRE_L2=1). Every loop is bounded.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config, l2_ready};
use zcfs_client::{Caller, Client, ClientConfig};
use zcfs_l2::endpoint::{CMD_CHUNK, CMD_REGION_LEN};
use zcfs_l2::{Endpoint, Event, Extent, SlotGeometry, BLOCK_SIZE, MAX_FRAME_LEN};
use zcfs_netns::{owned_name, Pair, CLI_IF, SRV_IF};
use zcfs_protocol::l2::{blocks_spanned, decode_reply, encode_landing_write, L2Reply};
use zcfs_protocol::{
    CreateReply, CreateReq, L2ReleaseReq, L2SetupReq, Name, NodeRef, Op, Reply, Request,
    RespHeader, WriteReq,
};
use zcfs_server::l2::{endpoint_config, L2Poll, L2Port, CMD_QUEUE, DATA_QUEUE};
use zcfs_server::Server;
use zcfs_types::Cred;
use zcfs_volume::{FsError, Volume, ROOT_INO};
use zcfs_xsk::{bind_retrying, mac_address, Desc, FrameIo, Region, XdpProgram, XskConfig};
use zcfs_xsk::{XskSocket, XDP_PACKET_HEADROOM};

/// A server whose backend is `vol` and whose lane maps `image` (the volume's own image
/// file: writes land in place), in the pair's server namespace.
struct Net {
    server: Arc<Server>,
    addr: String,
    thread: Option<std::thread::JoinHandle<()>>,
    pair: Pair,
}

impl Drop for Net {
    fn drop(&mut self) {
        let server = self.server.clone();
        let _ = self.pair.srv.run(move || server.shutdown());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A fresh volume of `size` bytes on a /dev/shm file (removed from the directory at
/// once) and that file, opened again for the lane.
fn shm_volume(label: &str, size: u64) -> (Arc<Volume>, std::fs::File) {
    let root = zcfs_volume::RootDir {
        uid: 0,
        gid: 0,
        mode: 0o777,
    };
    common::shm_volume(label, size, 1 << 20, root)
}

fn serve(label: &str, vol: Arc<Volume>, image: std::fs::File) -> Net {
    let pair = Pair::create_with_queues(&owned_name(std::process::id(), label), 83, 2).unwrap();
    let ip = pair.srv_ip;
    let (tx, rx) = std::sync::mpsc::channel();
    let backend = Arc::new(zcfs_local::LocalFs::new(vol));
    let thread = pair
        .srv
        .spawn(move || {
            let mut cfg = config();
            cfg.listen = zcfs_transport::Address::Tcp(format!("{ip}:0"));
            let server = Arc::new(Server::bind(backend, cfg).unwrap());
            let port = L2Port::open(SRV_IF, &image, L2Poll::Wait).unwrap();
            server.start_l2(port, L2Poll::Wait).unwrap();
            tx.send(server.clone()).unwrap();
            server.run();
        })
        .unwrap();
    let server = rx.recv().unwrap();
    let addr = server.tcp_addr().unwrap().to_string();
    Net {
        server,
        addr,
        thread: Some(thread),
        pair,
    }
}

/// The data queue of our peer: the kernel's socket, with a switch that makes the next
/// full-size frame it sends 4 bytes longer (1518 bytes: what a veth of MTU 1500 still
/// forwards, as would a NIC taking a VLAN tag's allowance; the 4 bytes are marked), and
/// one that sends nothing (a peer whose data queue is dead while its commands go).
struct Stretch {
    inner: XskSocket,
    armed: Arc<AtomicBool>,
    mute: Arc<AtomicBool>,
}

/// The bytes a stretched frame carries past the longest legal frame.
const MARK: [u8; 4] = [0xEE; 4];
const STRETCHED: u32 = MAX_FRAME_LEN as u32 + MARK.len() as u32;

impl FrameIo for Stretch {
    fn region(&self) -> &Region {
        self.inner.region()
    }
    fn fill(&mut self, addrs: &[u64]) -> usize {
        self.inner.fill(addrs)
    }
    fn fill_free(&self) -> usize {
        self.inner.fill_free()
    }
    fn recv(&mut self, out: &mut Vec<Desc>, max: usize) -> usize {
        self.inner.recv(out, max)
    }
    fn transmit(&mut self, frames: &[Desc]) -> usize {
        if self.mute.load(Ordering::SeqCst) {
            return 0;
        }
        let mut frames = frames.to_vec();
        let mut at = None;
        if self.armed.load(Ordering::SeqCst) {
            if let Some(i) = frames.iter().position(|d| d.len as usize == MAX_FRAME_LEN) {
                // The scratch chunk (CMD_CHUNK bytes) holds the longer frame.
                let d = &mut frames[i];
                self.inner
                    .region()
                    .write(d.addr + MAX_FRAME_LEN as u64, &MARK)
                    .unwrap();
                d.len = STRETCHED;
                at = Some(i);
            }
        }
        let n = self.inner.transmit(&frames);
        if at.is_some_and(|i| i < n) {
            self.armed.store(false, Ordering::SeqCst);
        }
        n
    }
    fn completions(&mut self, out: &mut Vec<u64>, max: usize) -> usize {
        self.inner.completions(out, max)
    }
    fn wait(&mut self, timeout: Duration) -> std::io::Result<bool> {
        self.inner.wait(timeout)
    }
}

/// TX scratch chunks of our peer, and where its send area begins.
const PEER_TX_CHUNKS: u32 = 128;
const PEER_SEND: u64 = PEER_TX_CHUNKS as u64 * CMD_CHUNK;
const PEER_SEND_LEN: u64 = (1 << 20) + 2 * BLOCK_SIZE as u64;

/// A session of our own on the server's lane: a TCP client (no lane of its own) that
/// asked for the lane itself, and an endpoint the test drives.
struct Peer {
    tcp: Client,
    ep: Endpoint<Stretch, XskSocket>,
    armed: Arc<AtomicBool>,
    mute: Arc<AtomicBool>,
    /// Who the landing writes are sent as (default: this process).
    cred: zcfs_protocol::Cred,
    t0: Instant,
    next_id: u64,
    _prog: XdpProgram,
}

/// What became of a landing write.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Reply(RespHeader),
    ResendTcp,
    /// Nothing within the limit.
    Silent,
}

impl Peer {
    /// Connect to `addr` and take the server's lane (run inside the client namespace).
    fn new(addr: &str) -> Peer {
        let tcp = Client::new(ClientConfig::new(addr));
        tcp.connect().unwrap();
        let region =
            Arc::new(Region::anonymous((PEER_SEND + PEER_SEND_LEN) as usize + 4096).unwrap());
        let cmd_region = Arc::new(Region::anonymous(CMD_REGION_LEN).unwrap());
        let mac = mac_address(CLI_IF).unwrap();
        let mut prog = XdpProgram::attach(CLI_IF).unwrap();
        let cfg = XskConfig::default();
        let data =
            bind_retrying(|| XskSocket::new(region.clone(), CLI_IF, DATA_QUEUE, cfg)).unwrap();
        let cmd =
            bind_retrying(|| XskSocket::new(cmd_region.clone(), CLI_IF, CMD_QUEUE, cfg)).unwrap();
        prog.register(DATA_QUEUE, &data).unwrap();
        prog.register(CMD_QUEUE, &cmd).unwrap();
        let geometry = SlotGeometry::packed(BLOCK_SIZE as u64, 1, 1);
        let req: Request = L2SetupReq {
            mac: zcfs_protocol::mac_to_u64(mac),
            cmd_queue: CMD_QUEUE,
            data_queue: DATA_QUEUE,
            geometry: zcfs_protocol::Blob::new(geometry.encode().to_vec()).unwrap(),
        }
        .into();
        let r = tcp.call(&req, Caller::process(), &[]).unwrap();
        let reply = match Reply::decode(Op::L2Setup, &r.body).unwrap() {
            Reply::L2Setup(a) => a,
            o => panic!("{o:?}"),
        };
        assert!(reply.accepted, "{reply:?}");
        assert!(reply.land_max > 0, "the server lands writes");
        let key = zcfs_protocol::l2::tag_key_material(None, &reply.nonce);
        let mut cfg = endpoint_config(mac, zcfs_protocol::mac_from_u64(reply.mac), 0);
        cfg.tx_scratch = (0, PEER_TX_CHUNKS);
        cfg.open_tags = true;
        let armed = Arc::new(AtomicBool::new(false));
        let mute = Arc::new(AtomicBool::new(false));
        let data = Stretch {
            inner: data,
            armed: armed.clone(),
            mute: mute.clone(),
        };
        let ep = Endpoint::new(cfg, &key, data, cmd).unwrap();
        Peer {
            tcp,
            ep,
            armed,
            mute,
            cred: Caller::process().cred,
            t0: Instant::now(),
            next_id: 1 << 40,
            _prog: prog,
        }
    }

    fn poll(&mut self) -> Vec<Event> {
        let evs = self.ep.poll(self.t0.elapsed().as_nanos() as u64).unwrap();
        if evs.is_empty() {
            let _ = self.ep.wait_command(Duration::from_micros(500));
        }
        evs
    }

    fn create(&self, name: &str) -> CreateReply {
        let r = self
            .tcp
            .call(
                &CreateReq {
                    parent: NodeRef::ino(ROOT_INO),
                    name: Name::new(name).unwrap(),
                    mode: libc::S_IFREG | 0o644,
                    flags: libc::O_RDWR,
                    umask: 0,
                }
                .into(),
                Caller::process(),
                &[],
            )
            .unwrap();
        match Reply::decode(Op::Create, &r.body).unwrap() {
            Reply::Create(c) => c,
            o => panic!("{o:?}"),
        }
    }

    /// Send a landing write of `data` at `offset` of `f` on the lane (its data goes
    /// when the server asks for it: `finish`). Returns the write's id.
    fn land(&mut self, f: &CreateReply, offset: u64, data: &[u8]) -> u64 {
        let w = WriteReq {
            node: NodeRef::new(f.attr.ino, f.attr.generation),
            fh: f.fh,
            offset,
            size: data.len() as u32,
            commit: false,
        };
        self.land_raw(w, blocks_spanned(offset, data.len() as u32), Some(data))
    }

    /// Send landing write `w` naming `blocks` blocks; `data` staged in the send area.
    fn land_raw(&mut self, w: WriteReq, blocks: u32, data: Option<&[u8]>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let offset = w.offset;
        let req: Request = w.into();
        let (hdr, body) = req.encode_with_groups(id, self.cred, &[]).unwrap();
        if let Some(data) = data {
            // The blocks as they go: the write's bytes at their place, zeros around.
            let lead = (offset % BLOCK_SIZE as u64) as usize;
            let spanned = blocks_spanned(offset, data.len() as u32);
            let mut staged = vec![0u8; spanned as usize * BLOCK_SIZE];
            staged[lead..lead + data.len()].copy_from_slice(data);
            self.ep
                .data()
                .expect("data socket")
                .region()
                .write(PEER_SEND, &staged)
                .unwrap();
        }
        self.ep
            .send_command(&encode_landing_write(blocks, &hdr, &body))
            .unwrap();
        id
    }

    /// Poll until landing write `id` is answered or `limit` passed; its data is sent
    /// from the send area when the server asks (unless `send` is false).
    fn finish(&mut self, id: u64, send: bool, limit: Duration) -> Outcome {
        let t = Instant::now();
        while t.elapsed() < limit {
            for ev in self.poll() {
                let Event::Command(bytes) = ev else { continue };
                match decode_reply(&bytes) {
                    Ok(L2Reply::SendData {
                        id: x,
                        xfer,
                        extents,
                    }) if x == id => {
                        if !send {
                            continue;
                        }
                        let mut at = PEER_SEND;
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
                        self.ep.send(xfer, &exts).unwrap();
                    }
                    Ok(L2Reply::Reply { header, .. }) if header.id == id => {
                        return Outcome::Reply(header)
                    }
                    Ok(L2Reply::ResendTcp { id: x }) if x == id => return Outcome::ResendTcp,
                    _ => {}
                }
            }
        }
        Outcome::Silent
    }
}

fn pattern(block: u64, seed: u8) -> Vec<u8> {
    (0..BLOCK_SIZE)
        .map(|i| (block as usize * 31 + i * 7 + seed as usize) as u8 | 1)
        .collect()
}

/// Fill `vol` with one file, then free 6 of every 7 of its blocks: the free space is
/// runs of at most 6 blocks with a live block (of that file, or a map node) behind each.
/// Returns the file and, per file block, whether it was kept.
fn fragmented(vol: &Volume) -> (u64, Vec<bool>) {
    let victim = vol
        .create(&Cred::ROOT, ROOT_INO, b"victim", libc::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    let mut blocks = 0u64;
    loop {
        match vol.write(
            &Cred::ROOT,
            victim,
            blocks * BLOCK_SIZE as u64,
            &pattern(blocks, 0x40),
        ) {
            Ok(n) if n == BLOCK_SIZE => blocks += 1,
            Ok(_) | Err(FsError::NoSpace) => break,
            Err(e) => panic!("{e:?}"),
        }
        assert!(blocks < 1 << 20, "the volume never filled");
    }
    let mut kept = vec![true; blocks as usize];
    for k in (0..blocks).step_by(7) {
        let (s, e) = (k + 1, (k + 7).min(blocks));
        if s < e {
            vol.pfree(
                &Cred::ROOT,
                victim,
                s * BLOCK_SIZE as u64,
                (e - s) * BLOCK_SIZE as u64,
            )
            .unwrap();
            kept[s as usize..e as usize].fill(false);
        }
    }
    vol.checkpoint_now().unwrap();
    (victim, kept)
}

/// The victim's blocks that no longer hold what was written (kept) or zeros (freed).
fn damaged(vol: &Volume, victim: u64, kept: &[bool]) -> Vec<(u64, usize, Vec<u8>)> {
    let mut bad = Vec::new();
    let mut got = vec![0u8; BLOCK_SIZE];
    for (b, &k) in kept.iter().enumerate() {
        let b = b as u64;
        let n = vol.read(victim, b * BLOCK_SIZE as u64, &mut got).unwrap();
        let want = if k {
            pattern(b, 0x40)
        } else {
            vec![0u8; BLOCK_SIZE]
        };
        if n != BLOCK_SIZE || got != want {
            let at = got.iter().zip(&want).position(|(a, w)| a != w).unwrap_or(n);
            bad.push((b, at, got[at.min(n)..(at + 4).min(n)].to_vec()));
        }
    }
    bad
}

/// The server receives a landing write's frames into the volume's own blocks, each
/// extent with a free gap block in front (for the 46 header bytes that survive) but
/// nothing behind: the kernel's receive chunk of an extent's highest segment reaches
/// `MIN_TAIL` (2326) bytes past the extent, and the kernel writes a frame of any
/// length its device took, up to the chunk. A veth of MTU 1500 forwards frames of
/// 1518 bytes (its VLAN allowance; a NIC does the same, or more), and the XDP program
/// redirects a data frame whatever its length. So one frame 4 bytes over the longest
/// legal one, landing in an extent's last slot, writes 4 bytes into the block behind
/// the extent: another file's data or the volume's metadata. The lane owner's stray
/// (or a neighbour's, whose untagged data frame the kernel places just the same)
/// changes a file that write never named; the landing write itself then succeeds
/// (the failed group is drained and sent again). On an interface with a larger MTU
/// (jumbo frames) a frame of up to the chunk less the headroom (3840 bytes) lands, and
/// writes up to MIN_TAIL bytes of the sender's choosing past the extent. A block left
/// "clean" (known zero) behind an extent is handed out later as zeros that are not.
#[test]
fn a_long_frame_landing_in_an_extents_last_slot_changes_no_other_files_block() {
    if !l2_ready() {
        return;
    }
    let (vol, image) = shm_volume("tail", 16 << 20);
    let (victim, kept) = fragmented(&vol);
    assert!(damaged(&vol, victim, &kept).is_empty(), "set-up");
    let n = serve("tail", vol.clone(), image);
    let addr = n.addr.clone();
    let outcomes = n
        .pair
        .cli
        .run(move || {
            let mut p = Peer::new(&addr);
            let mut outcomes = Vec::new();
            // 5 blocks: one extent in one of the 6-block holes (gap + 5), a live block
            // behind it. A few, should the first land in other free space.
            for i in 0..12 {
                let f = p.create(&format!("t{i}"));
                let data = vec![0x33u8; 5 * BLOCK_SIZE];
                p.armed.store(true, Ordering::SeqCst);
                let id = p.land(&f, 0, &data);
                outcomes.push(p.finish(id, true, Duration::from_secs(5)));
            }
            drop(p);
            outcomes
        })
        .unwrap();
    // The landing writes themselves went through (the failed group was sent again).
    for o in &outcomes {
        assert!(
            matches!(o, Outcome::Reply(h) if h.status == 0),
            "{outcomes:?}"
        );
    }
    let bad = damaged(&vol, victim, &kept);
    drop(n);
    assert!(
        bad.is_empty(),
        "blocks of a file no landing write named changed (file block, first byte that \
         differs, the 4 bytes there; the stray frame's are {MARK:02x?}): {bad:?}"
    );
}

/// Let `XDP_PACKET_HEADROOM` count as used (the layout in the comments above).
const _: () = assert!(XDP_PACKET_HEADROOM == 256);

impl Peer {
    /// Poll until the server asks for landing write `id`'s data (not sent) or `limit`
    /// passed; whether it asked.
    fn until_send_data(&mut self, id: u64, limit: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < limit {
            for ev in self.poll() {
                if let Event::Command(bytes) = ev {
                    if matches!(decode_reply(&bytes), Ok(L2Reply::SendData { id: x, .. }) if x == id)
                    {
                        return true;
                    }
                }
            }
        }
        false
    }
}

/// A landing write's blocks stay reserved until no receive entry points into them
/// (`Event::SlotsFree`), which needs the peer to fill the entries it was granted (a
/// drain's NOPs). A lane owner that stops answering with entries posted (its process
/// died, its lane fell and was fenced) leaves them posted: the transfer is aborted
/// after TRANSFER_TIMEOUT, but its SlotsFree comes only once a later lane owner drains
/// the entries. With no later owner the blocks (up to a credit window of transfers'
/// reservations, 1 MiB and its gaps each) stayed taken until the server restarted;
/// the server now makes its data socket again when the owner leaves (29ba07a), and
/// they come back at once.
#[test]
fn a_silent_lane_owners_landing_reservation_comes_back_after_it_left() {
    if !l2_ready() {
        return;
    }
    let (vol, image) = shm_volume("silent", 16 << 20);
    let n = serve("silent", vol.clone(), image);
    // The transfer times out after 2 s; give it 8.
    let t = Instant::now();
    let back = silent_owner_leaves(&n, &vol, 0, Duration::from_secs(8));
    drop(n);
    assert!(
        back,
        "free blocks not back {:?} after the lane owner left with a landing posted",
        t.elapsed()
    );
}

/// The lane's state as the server's stats show it: (up, reason).
fn lane_state(n: &Net) -> (bool, String) {
    let r = n.server.report().l2.expect("a lane");
    (r.up, r.reason)
}

/// One round: a lane owner sends a landing write of 1 MiB, its data queue sends
/// nothing (neither the data nor the NOPs of a skip), so the entries the server posts
/// stay posted, and it leaves (the fence on TCP, then the connection and the lane's
/// sockets). Returns once the volume's free blocks are back (or `limit` passed):
/// whether they are.
fn silent_owner_leaves(n: &Net, vol: &Arc<Volume>, round: usize, limit: Duration) -> bool {
    let addr = n.addr.clone();
    let v = vol.clone();
    let before = n
        .pair
        .cli
        .run(move || {
            let mut p = Peer::new(&addr);
            p.mute.store(true, Ordering::SeqCst);
            let f = p.create(&format!("silent{round}"));
            let before = v.statfs().bfree;
            let id = p.land(&f, 0, &vec![0x5a; 1 << 20]);
            assert!(
                p.until_send_data(id, Duration::from_secs(5)),
                "round {round}: the server asked for the data"
            );
            let held = v.statfs().bfree;
            assert!(
                held < before,
                "round {round}: the landing holds blocks ({held} < {before})"
            );
            std::thread::sleep(Duration::from_millis(100));
            p.leave();
            before
        })
        .unwrap();
    let t = Instant::now();
    while vol.statfs().bfree != before && t.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
    }
    vol.statfs().bfree == before
}

impl Peer {
    /// Give the lane back on TCP (the fence) and go.
    fn leave(self) {
        let req: Request = L2ReleaseReq {}.into();
        self.tcp.call(&req, Caller::process(), &[]).unwrap();
        drop(self);
    }
}

/// Linux capability sets of the calling thread (capget/capset, version 3).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_V3: u32 = 0x2008_0522;
const CAP_IPC_LOCK: u32 = 14;

/// Take CAP_IPC_LOCK out of the calling thread's effective set (threads it starts
/// inherit that): its AF_XDP UMEMs are then charged against RLIMIT_MEMLOCK, as a
/// server's are that runs with `ulimit -l` raised for its lane rather than with
/// CAP_IPC_LOCK (what XskError::MemlockLimit tells the operator to do).
fn drop_ipc_lock_in_this_thread() {
    let mut h = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut d = [CapData::default(); 2];
    // SAFETY: a valid header and two data structs, as version 3 wants.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut h as *mut CapHeader, d.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    d[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: as above.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut h as *mut CapHeader, d.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

/// The process's RLIMIT_MEMLOCK (soft, hard).
fn memlock() -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) }, 0);
    (r.rlim_cur, r.rlim_max)
}

/// Sets the process's soft RLIMIT_MEMLOCK (lower only) for the test's length, and
/// back on drop.
struct MemlockFor(libc::rlimit);

impl MemlockFor {
    fn set(bytes: u64) -> MemlockFor {
        let (cur, max) = memlock();
        let r = libc::rlimit {
            rlim_cur: bytes.min(cur),
            rlim_max: max,
        };
        // SAFETY: a valid rlimit.
        let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) };
        assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
        MemlockFor(libc::rlimit {
            rlim_cur: cur,
            rlim_max: max,
        })
    }
}

impl Drop for MemlockFor {
    fn drop(&mut self) {
        // SAFETY: a valid rlimit.
        unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &self.0) };
    }
}

/// Review 29 (of 29ba07a), finding 1: `L2Port::reopen_data` closes the data socket and at once
/// registers the same memory (the volume image and the lane's ~66 MiB of staging) as the
/// UMEM of a new socket (`XskSocket::new`: XDP_UMEM_REG, then bind). The kernel takes
/// the old UMEM's pages off the user's locked-memory count only in deferred work after
/// the old socket is freed (the same work that lets the queue go, whence
/// `bind_retrying`'s EBUSY). A server whose lane memory is charged against
/// RLIMIT_MEMLOCK (no CAP_IPC_LOCK, `ulimit -l` raised for the lane, as
/// `XskError::MemlockLimit` advises) is then charged for the region twice: the new
/// XDP_UMEM_REG fails with ENOBUFS, which `bind_retrying` does not try again (it
/// retries EBUSY at bind only), and `run` stops the lane for good ("the data socket
/// could not be made again") the first time an owner leaves with a landing write
/// posted: an ordinary event (its process died, its link fell) that before 29ba07a cost
/// a few reserved blocks until the next owner.
///
/// The server's own lane cannot be opened under a limit here (its region is 82 MiB,
/// this machine's hard RLIMIT_MEMLOCK 8 MiB, and the tests lack CAP_SYS_RESOURCE to
/// raise it; with a 300 ms pause after the close, this passes), so this does what `reopen_data` does, step for step, with a 5 MiB region
/// under an 8 MiB limit: a data socket on queue 1 registered with the interface's XDP
/// program, dropped, then `bind_retrying(|| XskSocket::new(same region, same queue))`
/// and `register`, on a thread without CAP_IPC_LOCK (as the lane's service thread of
/// such a server).
#[test]
fn a_data_socket_made_again_on_its_memory_at_once_fits_the_memlock_limit_it_fit() {
    if !l2_ready() {
        return;
    }
    const LEN: usize = 5 << 20;
    let _limit = MemlockFor::set(8 << 20);
    let (soft, _) = memlock();
    assert!(
        (LEN as u64) < soft && 2 * LEN as u64 > soft,
        "set-up: RLIMIT_MEMLOCK {soft} holds the region once, not twice"
    );
    let pair = Pair::create_with_queues(&owned_name(std::process::id(), "umem"), 85, 2).unwrap();
    let r = pair
        .srv
        .spawn(|| {
            drop_ipc_lock_in_this_thread();
            let region = Arc::new(Region::anonymous(LEN).unwrap());
            let cfg = XskConfig::default();
            let mut prog = XdpProgram::attach(SRV_IF).unwrap();
            let mut current = Some(
                bind_retrying(|| XskSocket::new(region.clone(), SRV_IF, DATA_QUEUE, cfg))
                    .map_err(|e| format!("set-up: the first socket: {e}"))?,
            );
            prog.register(DATA_QUEUE, current.as_ref().unwrap())
                .unwrap();
            // A few rounds, as a few owners leaving would make.
            for round in 0..3 {
                // The old socket goes first (reopen_data: `self.data = None`).
                drop(current.take());
                let t = Instant::now();
                match bind_retrying(|| XskSocket::new(region.clone(), SRV_IF, DATA_QUEUE, cfg)) {
                    Ok(s) => {
                        prog.register(DATA_QUEUE, &s).unwrap();
                        current = Some(s);
                    }
                    Err(e) => {
                        return Err(format!(
                            "round {round}: the data socket could not be made again \
                             ({:?} after the old one closed): {e}",
                            t.elapsed()
                        ))
                    }
                }
            }
            drop(current);
            Ok(())
        })
        .unwrap()
        .join()
        .unwrap();
    drop(pair);
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// Not a finding (what was checked of 29ba07a and found sound): three lane owners in
/// turn leave silent with a landing write posted (a server with CAP_IPC_LOCK): each
/// time the blocks come back at once, the lane stays up, and the next owner's landing
/// write lands through the data socket made again.
#[test]
fn after_data_socket_reopens_the_next_owner_still_lands_writes() {
    if !l2_ready() {
        return;
    }
    let (vol, image) = shm_volume("reopen", 16 << 20);
    let n = serve("reopen", vol.clone(), image);
    for round in 0..3 {
        let back = silent_owner_leaves(&n, &vol, round, Duration::from_secs(8));
        let (up, reason) = lane_state(&n);
        assert!(
            up && back,
            "round {round}: up {up} ({reason:?}), blocks back {back}"
        );
    }
    let addr = n.addr.clone();
    let outcome = n
        .pair
        .cli
        .run(move || {
            let mut p = Peer::new(&addr);
            let f = p.create("after");
            let id = p.land(&f, 0, &vec![0x77; 300_000]);
            let o = p.finish(id, true, Duration::from_secs(5));
            p.leave();
            o
        })
        .unwrap();
    drop(n);
    assert!(
        matches!(outcome, Outcome::Reply(h) if h.status == 0),
        "{outcome:?}"
    );
}

/// Create `name` in the root through `c`, opened for reading and writing.
fn create_on(c: &Client, name: &str) -> CreateReply {
    let req: Request = CreateReq {
        parent: NodeRef::ino(ROOT_INO),
        name: Name::new(name).unwrap(),
        mode: libc::S_IFREG | 0o666,
        flags: libc::O_RDWR,
        umask: 0,
    }
    .into();
    match Reply::decode(
        Op::Create,
        &c.call(&req, Caller::process(), &[]).unwrap().body,
    )
    .unwrap()
    {
        Reply::Create(c) => c,
        o => panic!("{o:?}"),
    }
}

/// A landing write to send: what, as whom, the write, the blocks it names, and the
/// answers that may come (a reply's status; None: "resend on TCP").
type Case<'a> = (
    &'a str,
    zcfs_protocol::Cred,
    WriteReq,
    u32,
    Vec<Option<i32>>,
);

/// Ruled out: a landing write gets a TCP write's checks (a handle opened read-only,
/// another session's handle, a handle of another file: EBADF; no handle: the caller's
/// access as open checks it, then on TCP or landed with its node held; blocks that are not the ones the write spans, more than
/// MAX_LANDING_WRITE bytes: EINVAL), and a good one after all of them lands.
#[test]
fn a_landing_write_is_checked_as_a_tcp_write_is() {
    if !l2_ready() {
        return;
    }
    let (vol, image) = shm_volume("checks", 16 << 20);
    let n = serve("checks", vol, image);
    let addr = n.addr.clone();
    n.pair
        .cli
        .run(move || {
            let other = Client::new(ClientConfig::new(&addr));
            other.connect().unwrap();
            let theirs = create_on(&other, "theirs");
            let mut p = Peer::new(&addr);
            let f = p.create("f");
            let node = NodeRef::new(f.attr.ino, f.attr.generation);
            let req: Request = zcfs_protocol::OpenReq {
                node,
                flags: libc::O_RDONLY,
            }
            .into();
            let r = p.tcp.call(&req, Caller::process(), &[]).unwrap();
            let ro = match Reply::decode(Op::Open, &r.body).unwrap() {
                Reply::Open(o) => o.fh,
                o => panic!("{o:?}"),
            };
            const LEN: u32 = 40000;
            let data = vec![9u8; LEN as usize];
            let w = |node, fh, offset, size| WriteReq {
                node,
                fh,
                offset,
                size,
                commit: false,
            };
            let tnode = NodeRef::new(theirs.attr.ino, theirs.attr.generation);
            // What may come back: a reply's status, or None for "resend on TCP".
            let status = |e: i32| vec![Some(e)];
            let user = zcfs_protocol::Cred {
                uid: 1000,
                gid: 1000,
            };
            let root = p.cred;
            #[rustfmt::skip]
            let cases: Vec<Case> = vec![
                ("a read-only handle", root, w(node, ro, 0, LEN), 10, status(libc::EBADF)),
                ("another session's handle", root, w(tnode, theirs.fh, 0, LEN), 10, status(libc::EBADF)),
                ("a handle of another file", root, w(tnode, f.fh, 0, LEN), 10, status(libc::EBADF)),
                // No handle: checked as open would (then on TCP, or landed with the node
                // held: both are a TCP write's checks).
                ("no handle, a caller who may not write", user, w(node, 0, 0, LEN), 10, status(libc::EACCES)),
                ("no handle", root, w(node, 0, 0, LEN), 10, vec![None, Some(0)]),
                ("blocks too few", root, w(node, f.fh, 0, LEN), 9, status(libc::EINVAL)),
                ("blocks too many", root, w(node, f.fh, 0, LEN), 11, status(libc::EINVAL)),
                ("over 1 MiB", root, w(node, f.fh, 0, (1 << 20) + 1), 257, status(libc::EINVAL)),
                ("a good one", root, w(node, f.fh, 100, LEN), 10, status(0)),
            ];
            for (what, cred, wr, blocks, want) in cases {
                p.cred = cred;
                let stage = (wr.size == LEN).then_some(&data[..]);
                let id = p.land_raw(wr, blocks, stage);
                let got = match p.finish(id, true, Duration::from_secs(3)) {
                    Outcome::Reply(h) => Some(h.status),
                    Outcome::ResendTcp => None,
                    Outcome::Silent => panic!("{what}: no answer"),
                };
                assert!(want.contains(&got), "{what}: {got:?}, not one of {want:?}");
            }
            // Nothing of the refused ones reached a file.
            let r: Request = zcfs_protocol::ReadReq {
                node: tnode,
                fh: 0,
                offset: 0,
                size: 1 << 20,
            }
            .into();
            assert!(other
                .call(&r, Caller::process(), &[])
                .unwrap()
                .data
                .is_empty());
        })
        .unwrap();
    drop(n);
}

/// Ruled out: byte ranges owned by writers (three threads of a lane client, whose
/// writes land, and a TCP client's small writes), their boundaries inside blocks: each
/// byte ends as its owner last wrote it (a landing's edge bytes come from the file at
/// commit, not from what the frames carried).
#[test]
fn writers_whose_ranges_share_blocks_keep_each_others_bytes() {
    if !l2_ready() {
        return;
    }
    let (vol, image) = shm_volume("edges", 64 << 20);
    let n = serve("edges", vol, image);
    let addr = n.addr.clone();
    n.pair
        .cli
        .run(move || {
            let mut cfg = ClientConfig::new(&addr);
            let mut o = zcfs_client::l2::L2Options::new(CLI_IF);
            o.land_max = Some(zcfs_protocol::l2::MAX_LANDING_WRITE);
            cfg.l2 = Some(o);
            let c = Arc::new(Client::new(cfg));
            c.connect().unwrap();
            assert!(c.l2_status().unwrap().0);
            let tcp = Arc::new(Client::new(ClientConfig::new(&addr)));
            tcp.connect().unwrap();
            let f = create_on(&c, "e");
            // (owner, start, length): owners 0..3 on the lane, 3 on TCP.
            let mut ranges = Vec::new();
            let (mut at, mut k) = (1234u64, 0u64);
            while at < 12 << 20 {
                let owner = (k % 4) as usize;
                let len = if owner == 3 {
                    3001
                } else {
                    200_000 + (k * 7919) % 500_000
                };
                ranges.push((owner, at, len));
                at += len;
                k += 1;
            }
            let ranges = Arc::new(ranges);
            let node = NodeRef::new(f.attr.ino, f.attr.generation);
            const ROUNDS: u8 = 6;
            let mut ts = Vec::new();
            for owner in 0..4usize {
                let client = if owner == 3 { tcp.clone() } else { c.clone() };
                let fh = if owner == 3 { 0 } else { f.fh };
                let ranges = ranges.clone();
                ts.push(std::thread::spawn(move || {
                    for round in 1..=ROUNDS {
                        for &(o, s, l) in ranges.iter().filter(|r| r.0 == owner) {
                            let data = vec![(o as u8) << 4 | round; l as usize];
                            let req: Request = WriteReq {
                                node,
                                fh,
                                offset: s,
                                size: l as u32,
                                commit: false,
                            }
                            .into();
                            client.call(&req, Caller::process(), &[&data]).unwrap();
                        }
                    }
                }));
            }
            for t in ts {
                t.join().unwrap();
            }
            let r = c.lane_report().unwrap();
            assert!(r.counters["landed"] > 100, "{r:?}");
            for &(o, s, l) in ranges.iter() {
                let want = (o as u8) << 4 | ROUNDS;
                let mut pos = s;
                while pos < s + l {
                    let k = (s + l - pos).min(1 << 20);
                    let req: Request = zcfs_protocol::ReadReq {
                        node,
                        fh: 0,
                        offset: pos,
                        size: k as u32,
                    }
                    .into();
                    let got = tcp.call(&req, Caller::process(), &[]).unwrap().data;
                    assert_eq!(got.len() as u64, k);
                    let bad = got.iter().position(|&b| b != want);
                    assert!(
                        bad.is_none(),
                        "byte {} of owner {o}'s range is {:#x}",
                        pos + bad.unwrap() as u64,
                        got[bad.unwrap()]
                    );
                    pos += k;
                }
            }
        })
        .unwrap();
    drop(n);
}

/// What a lane owner that asks for landing writes and never sends their data can keep
/// reserved is bounded: the server holds at most `MAX_PENDING_LANDINGS` landing writes
/// at once and sends the rest on TCP ("resend on TCP"), so the known limitation above
/// costs at most that many writes of `MAX_LANDING_WRITE` bytes and their gaps.
#[test]
fn a_silent_owner_holds_at_most_max_pending_landings_reservations() {
    if !l2_ready() {
        return;
    }
    use zcfs_server::l2::MAX_PENDING_LANDINGS;
    let (vol, image) = shm_volume("cap", 64 << 20);
    let n = serve("cap", vol.clone(), image);
    let addr = n.addr.clone();
    let v = vol.clone();
    n.pair
        .cli
        .run(move || {
            let mut p = Peer::new(&addr);
            p.mute.store(true, Ordering::SeqCst);
            let f = p.create("f");
            let before = v.statfs().bfree;
            let most = zcfs_protocol::l2::MAX_LANDING_WRITE as usize;
            let extra = 4;
            let ids: Vec<u64> = (0..MAX_PENDING_LANDINGS + extra)
                .map(|i| p.land(&f, (i * most) as u64, &vec![0x11; most]))
                .collect();
            let (mut asked, mut resent) = (0, 0);
            let t = Instant::now();
            while asked + resent < ids.len() && t.elapsed() < Duration::from_secs(10) {
                for ev in p.poll() {
                    let Event::Command(bytes) = ev else { continue };
                    match decode_reply(&bytes) {
                        Ok(L2Reply::SendData { id, .. }) if ids.contains(&id) => asked += 1,
                        Ok(L2Reply::ResendTcp { id }) if ids.contains(&id) => resent += 1,
                        _ => {}
                    }
                }
            }
            assert_eq!((asked, resent), (MAX_PENDING_LANDINGS, extra));
            // Each held write: 256 blocks and at least a gap per 32 and a guard.
            let held = before - v.statfs().bfree;
            let per = (most / BLOCK_SIZE) as u64;
            assert!(
                held >= MAX_PENDING_LANDINGS as u64 * (per + per / 32 + 1)
                    && held <= MAX_PENDING_LANDINGS as u64 * 2 * per,
                "{held} blocks held"
            );
        })
        .unwrap();
    drop(n);
}
