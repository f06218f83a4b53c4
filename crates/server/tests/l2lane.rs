//! The layer-2 lane end to end through the client library, over a two-queue veth pair
//! between two namespaces (root; skipped otherwise unless ZCFS_REQUIRE_L2=1): requests
//! whose per-path counters prove they went over layer 2, reads and small writes
//! against a model, and the fallbacks to TCP. Every loop is bounded.

#[macro_use]
mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{config, l2_ready, memory_fs};
use zcfs_backend::{Backend, ROOT};
use zcfs_client::l2::{L2Options, L2Poll, L2_RETRY_AFTER};
use zcfs_client::{Caller, Client, ClientConfig};
use zcfs_netns::{owned_name, Pair, CLI_IF, SRV_IF};
use zcfs_protocol::l2::MAX_WRITE;
use zcfs_protocol::{
    CreateReply, CreateReq, ForgetItem, ForgetReq, GetattrReq, List, LookupName, LookupReq, Name,
    NodeRef, Op, ReadReq, ReleaseReq, Reply, Request, StatfsReq, WriteReq,
};
use zcfs_server::l2::L2Port;
use zcfs_server::Server;

/// The image the server's data socket maps: a /dev/shm file (removed from the
/// directory at once).
fn shm_image(label: &str, len: usize) -> std::fs::File {
    // One name per image: tests running at once in this process each make one (with
    // the same label, one removed the other's name before it did).
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let path = format!(
        "/dev/shm/zcfs-l2lane-{}-{}-{label}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f.set_len(len as u64).unwrap();
    f
}

struct Net {
    /// None only while `restart` replaces it.
    server: Option<Arc<Server>>,
    addr: String,
    thread: Option<std::thread::JoinHandle<()>>,
    pair: Pair,
}

impl Drop for Net {
    fn drop(&mut self) {
        // From inside the namespace: shutdown wakes the accept loop by connecting to it.
        if let Some(server) = self.server.clone() {
            let _ = self.pair.srv.run(move || server.shutdown());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Net {
    fn server(&self) -> Arc<Server> {
        self.server.clone().expect("a server")
    }

    /// Stop the server (`meanwhile` runs once its connections are closed), then serve
    /// `backend` at the same address with a new server (a restart: a new instance, no
    /// sessions, no lane).
    fn restart(&mut self, backend: Arc<dyn Backend>, meanwhile: impl FnOnce()) {
        let old = self.server.take().expect("a server");
        let stopping = old.clone();
        self.pair.srv.run(move || stopping.shutdown()).unwrap();
        meanwhile();
        self.thread.take().unwrap().join().unwrap();
        drop(old);
        let (tx, rx) = std::sync::mpsc::channel();
        let listen = self.addr.clone();
        self.thread = Some(
            self.pair
                .srv
                .spawn(move || {
                    let mut cfg = config();
                    cfg.listen = zcfs_transport::Address::Tcp(listen);
                    let server = Arc::new(Server::bind(backend, cfg).unwrap());
                    tx.send(server.clone()).unwrap();
                    server.run();
                })
                .unwrap(),
        );
        self.server = Some(rx.recv().unwrap());
    }
}

/// A server in the pair's server namespace, with the layer-2 lane on its veth end when
/// `l2`.
fn net(label: &str, l2: bool) -> Net {
    net_with(label, memory_fs(64 << 20), l2)
}

fn net_with(label: &str, backend: Arc<dyn Backend>, l2: bool) -> Net {
    net_secret(label, backend, l2, None)
}

/// [`net_with`], the server requiring `secret` of its clients when given.
fn net_secret(label: &str, backend: Arc<dyn Backend>, l2: bool, secret: Option<&[u8]>) -> Net {
    let image = l2.then(|| shm_image("img", 4 << 20));
    net_image(label, backend, image, secret)
}

/// A server whose backend is a fresh volume on a /dev/shm image of `size` bytes, its
/// lane's memory that same image: writes land in place.
fn net_landing(label: &str, size: u64) -> Net {
    let root = zcfs_volume::RootDir {
        uid: 1000,
        gid: 1000,
        mode: 0o755,
    };
    let (vol, image) = common::shm_volume(label, size, 4 << 20, root);
    net_image(
        label,
        Arc::new(zcfs_local::LocalFs::new(vol)),
        Some(image),
        None,
    )
}

/// A server of `backend`, with the lane on its veth end when `image` (the lane's
/// memory) is given.
fn net_image(
    label: &str,
    backend: Arc<dyn Backend>,
    image: Option<std::fs::File>,
    secret: Option<&[u8]>,
) -> Net {
    let secret = secret.map(|s| s.to_vec());
    let pair = Pair::create_with_queues(&owned_name(std::process::id(), label), 79, 2).unwrap();
    let ip = pair.srv_ip;
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = pair
        .srv
        .spawn(move || {
            let mut cfg = config();
            cfg.listen = zcfs_transport::Address::Tcp(format!("{ip}:0"));
            cfg.secret = secret;
            let server = Arc::new(Server::bind(backend, cfg).unwrap());
            if let Some(image) = image {
                let port = L2Port::open(SRV_IF, &image, poll_mode()).unwrap();
                server.start_l2(port, poll_mode()).unwrap();
            }
            tx.send(server.clone()).unwrap();
            server.run();
        })
        .unwrap();
    let server = rx.recv().unwrap();
    let addr = server.tcp_addr().unwrap().to_string();
    Net {
        server: Some(server),
        addr,
        thread: Some(thread),
        pair,
    }
}

/// A stalling backend's wait: wake the test (the call is marked stalled), then wait, at
/// most 30 s, until the test releases it.
fn stall_until<'a, T>(
    cv: &Condvar,
    mut st: std::sync::MutexGuard<'a, T>,
    released: impl Fn(&T) -> bool,
) -> std::sync::MutexGuard<'a, T> {
    cv.notify_all();
    let t = Instant::now();
    while !released(&st) && t.elapsed() < Duration::from_secs(30) {
        st = cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
    }
    st
}

/// Both sides' poll mode: wait, or busy with `ZCFS_TEST_L2_POLL=busy` (for the figures
/// of `qd1_latency_over_layer_2_and_tcp`).
fn poll_mode() -> L2Poll {
    match std::env::var("ZCFS_TEST_L2_POLL").as_deref() {
        Ok("busy") => L2Poll::Busy,
        _ => L2Poll::Wait,
    }
}

fn client_cfg(addr: &str, iface: &str) -> ClientConfig {
    let mut c = ClientConfig::new(addr);
    c.l2 = Some(L2Options {
        poll: poll_mode(),
        ..L2Options::new(iface)
    });
    c
}

/// [`lane_client`] that lands every write the lane takes above the inline limit,
/// whatever its poll mode (the default lands none when waiting).
fn landing_client(addr: &str) -> Client {
    let mut cfg = client_cfg(addr, CLI_IF);
    cfg.l2.as_mut().unwrap().land_max = Some(zcfs_protocol::l2::MAX_LANDING_WRITE);
    let c = Client::new(cfg);
    c.connect().unwrap();
    assert!(
        c.l2_status().expect("the lane was set up").0,
        "the lane is up"
    );
    c
}

/// A client of `addr` offering the lane on [`CLI_IF`], connected, its lane up.
fn lane_client(addr: &str) -> Client {
    let c = Client::new(client_cfg(addr, CLI_IF));
    c.connect().unwrap();
    assert!(
        c.l2_status().expect("the lane was set up").0,
        "the lane is up"
    );
    c
}

fn me() -> Caller<'static> {
    Caller::process()
}

fn create(c: &Client, name: &str) -> CreateReply {
    let r = c
        .call(
            &CreateReq {
                parent: NodeRef::ino(ROOT),
                name: Name::new(name).unwrap(),
                mode: libc::S_IFREG | 0o644,
                flags: libc::O_RDWR,
                umask: 0,
            }
            .into(),
            me(),
            &[],
        )
        .unwrap();
    match Reply::decode(Op::Create, &r.body).unwrap() {
        Reply::Create(c) => c,
        o => panic!("{o:?}"),
    }
}

fn write(c: &Client, f: &CreateReply, offset: u64, data: &[u8]) {
    let req: Request = WriteReq {
        node: NodeRef::new(f.attr.ino, f.attr.generation),
        fh: f.fh,
        offset,
        size: data.len() as u32,
        commit: false,
    }
    .into();
    c.call(&req, me(), &[data]).unwrap();
}

fn read(c: &Client, f: &CreateReply, offset: u64, size: u32) -> Vec<u8> {
    let req: Request = ReadReq {
        node: NodeRef::new(f.attr.ino, f.attr.generation),
        fh: f.fh,
        offset,
        size,
    }
    .into();
    c.call(&req, me(), &[]).unwrap().data
}

fn l2_count(c: &Client, op: Op) -> u64 {
    c.l2_counters.requests[op as usize].load(Ordering::Relaxed)
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Library operations over layer 2: the per-path counters of client and server show
/// they went there; 4 KiB reads and small writes match a model over many random ops.
#[test]
fn library_ops_go_over_layer_2_and_match_a_model() {
    if !l2_ready() {
        return;
    }
    let n = net("lib", true);
    let addr = n.addr.clone();
    let server = n.server();
    n.pair
        .cli
        .run(move || {
            let c = lane_client(&addr);
            let f = create(&c, "f");
            const FILE: usize = 256 << 10;
            let mut model = vec![0u8; FILE];
            let mut rng = Rng(0x5eed);
            for (i, b) in model.iter_mut().enumerate() {
                *b = (i * 7 + 3) as u8;
            }
            // Filled with 1 KiB writes (inline).
            for (i, chunk) in model.chunks(1024).enumerate() {
                write(&c, &f, (i * 1024) as u64, chunk);
            }
            const OPS: usize = 3000;
            let (mut long, mut lane_writes) = (0, 256u64);
            for _ in 0..OPS {
                if rng.below(3) == 0 {
                    // Most writes fit one command; one in four needs parts (up to
                    // the most a lane request carries, and a few bytes past it).
                    let len = if rng.below(4) == 0 {
                        long += 1;
                        1 + rng.below(MAX_WRITE as u64 + 64) as usize
                    } else {
                        1 + rng.below(1024) as usize
                    };
                    lane_writes += (len <= MAX_WRITE as usize) as u64;
                    let off = rng.below((FILE - len) as u64) as usize;
                    let data: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
                    write(&c, &f, off as u64, &data);
                    model[off..off + len].copy_from_slice(&data);
                } else {
                    let off = rng.below((FILE / 4096) as u64) as usize * 4096;
                    assert_eq!(read(&c, &f, off as u64, 4096), &model[off..off + 4096]);
                }
            }
            // A short read at the end of the file.
            assert_eq!(
                read(&c, &f, (FILE - 100) as u64, 4096),
                &model[FILE - 100..]
            );
            let look = c
                .call(
                    &LookupReq {
                        parent: NodeRef::ino(ROOT),
                        name: LookupName::new("f").unwrap(),
                    }
                    .into(),
                    me(),
                    &[],
                )
                .unwrap();
            assert_eq!(look.hdr.status, 0);
            c.call(
                &GetattrReq {
                    node: NodeRef::new(f.attr.ino, f.attr.generation),
                }
                .into(),
                me(),
                &[],
            )
            .unwrap();
            // A missing name: the errno comes over layer 2 too.
            let e = c
                .call(
                    &LookupReq {
                        parent: NodeRef::ino(ROOT),
                        name: LookupName::new("nope").unwrap(),
                    }
                    .into(),
                    me(),
                    &[],
                )
                .unwrap_err();
            assert_eq!(e.errno, libc::ENOENT);
            assert!(l2_count(&c, Op::Read) > OPS as u64 / 2);
            // Writes up to MAX_WRITE ride the lane inline (the 256 fills and the
            // random ones, in parts when longer than a command); larger ones go on TCP.
            assert!(long > 100, "{long} long writes");
            assert_eq!(l2_count(&c, Op::Write), lane_writes);
            assert!(l2_count(&c, Op::Create) == 1);
            assert!(l2_count(&c, Op::Lookup) == 2);
            assert!(l2_count(&c, Op::Getattr) == 1);
            assert_eq!(c.l2_counters.fell_back.load(Ordering::Relaxed), 0);
            assert!(c.l2_status().unwrap().0, "the lane stayed up");
        })
        .unwrap();
    eprintln!("client side done");
    let l2 = server.l2_requests();
    assert!(l2[Op::Read as usize] > 1000, "{:?}", &l2[..]);
    drop(n);
}

/// Several threads share one lane: one polls for everyone (the leader) and the others
/// wait for it to hand out their replies (followers), in turn, with the lane's busy
/// waiter yielding. Each thread reads and writes its own part of one file against its
/// own model; every read matches, every request went over the lane, none fell back, in
/// both poll modes. (A follower's missed wake-up would cost it at most the 1 ms slice it
/// waits: this test checks whose reply is whose, not how fast followers are woken.)
#[test]
fn threads_sharing_a_lane_get_their_own_replies_in_both_poll_modes() {
    if !l2_ready() {
        return;
    }
    let n = net("share", true);
    let addr = n.addr.clone();
    n.pair
        .cli
        .run(move || {
            for poll in [L2Poll::Busy, L2Poll::Wait] {
                let mut cfg = client_cfg(&addr, CLI_IF);
                cfg.l2.as_mut().unwrap().poll = poll;
                let c = Arc::new(Client::new(cfg));
                c.connect().unwrap();
                assert!(c.l2_status().expect("the lane was set up").0);
                let f = Arc::new(create(&c, &format!("shared-{poll:?}")));
                const THREADS: usize = 4;
                const PART: usize = 64 << 10;
                const OPS: usize = 1500;
                let (reads0, writes0) = (l2_count(&c, Op::Read), l2_count(&c, Op::Write));
                let workers: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let (c, f) = (c.clone(), f.clone());
                        std::thread::spawn(move || {
                            let base = t * PART;
                            let mut model = vec![0u8; PART];
                            for (i, b) in model.iter_mut().enumerate() {
                                *b = (i as u8) ^ (t as u8 * 51);
                            }
                            for (i, chunk) in model.chunks(4096).enumerate() {
                                write(&c, &f, (base + i * 4096) as u64, chunk);
                            }
                            let mut rng = Rng(0x5eed + t as u64);
                            let (mut reads, mut writes) = (0u64, (PART / 4096) as u64);
                            for _ in 0..OPS {
                                if rng.below(3) == 0 {
                                    let len = 1 + rng.below(4096) as usize;
                                    let off = rng.below((PART - len) as u64) as usize;
                                    let data: Vec<u8> =
                                        (0..len).map(|_| rng.below(256) as u8).collect();
                                    write(&c, &f, (base + off) as u64, &data);
                                    model[off..off + len].copy_from_slice(&data);
                                    writes += 1;
                                } else {
                                    let off = rng.below((PART / 4096) as u64) as usize * 4096;
                                    let got = read(&c, &f, (base + off) as u64, 4096);
                                    assert_eq!(got, &model[off..off + 4096], "thread {t} at {off}");
                                    reads += 1;
                                }
                            }
                            (reads, writes)
                        })
                    })
                    .collect();
                let (mut reads, mut writes) = (0, 0);
                for w in workers {
                    let (r, wr) = w.join().expect("a worker panicked");
                    reads += r;
                    writes += wr;
                }
                assert_eq!(
                    l2_count(&c, Op::Read) - reads0,
                    reads,
                    "{poll:?}: reads on the lane"
                );
                assert_eq!(
                    l2_count(&c, Op::Write) - writes0,
                    writes,
                    "{poll:?}: writes on the lane"
                );
                assert_eq!(
                    c.l2_counters.fell_back.load(Ordering::Relaxed),
                    0,
                    "{poll:?}"
                );
                assert!(c.l2_status().unwrap().0, "{poll:?}: the lane stayed up");
            }
        })
        .unwrap();
    drop(n);
}

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD names the calling thread.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// (Review 35b.) A read whose reply comes and whose data does not (the client's veth
/// drops the full-size data frames; the small reply passes) is half done: its waiting
/// caller polls again at once for at most HALF_DONE_SPIN and then sleeps in poll(2)
/// until the lane gives the read up and it goes on TCP. Before the fix the caller took
/// the reply as done and polled again at once with the lane's lock held: 1.0 s of CPU
/// (the whole L2_REPLY_TIMEOUT) for this read; sleeping, about 17 ms.
#[test]
fn a_waiting_read_with_its_reply_but_not_its_data_sleeps_after_the_half_done_spin() {
    if !l2_ready() {
        return;
    }
    let n = net("halfspin", true);
    let (addr, cli_ns) = (n.addr.clone(), &n.pair.cli);
    n.pair
        .cli
        .run(move || {
            let mut cfg = client_cfg(&addr, CLI_IF);
            cfg.l2.as_mut().unwrap().poll = L2Poll::Wait;
            let c = Client::new(cfg);
            c.connect().unwrap();
            assert!(c.l2_status().expect("the lane was set up").0, "the lane is up");
            let f = create(&c, "f");
            let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
            write(&c, &f, 0, &data);
            // A read over the lane first: its data came, the lane is a good one.
            let before = l2_count(&c, Op::Read);
            assert_eq!(read(&c, &f, 0, 4096), data);
            assert_eq!(l2_count(&c, Op::Read), before + 1, "the first read went over the lane");

            // Full-size frames to the client are dropped from now on (the reply is
            // small); put back after 2.5 s, so that the read resent on TCP completes.
            cli_ns.ip(&["link", "set", CLI_IF, "mtu", "1000"]).unwrap();
            let cli = zcfs_netns::Netns::open(cli_ns.name()).unwrap();
            let restore = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(2500));
                cli.ip(&["link", "set", CLI_IF, "mtu", "1500"]).unwrap();
            });
            let (cpu0, t0) = (thread_cpu(), Instant::now());
            // Bounded: the lane gives up within L2_REPLY_TIMEOUT, and TCP goes on once
            // the MTU is back.
            let got = read(&c, &f, 0, 4096);
            let (cpu, wall) = (thread_cpu() - cpu0, t0.elapsed());
            restore.join().unwrap();
            eprintln!(
                "read with its data dropped: {wall:?} wall, {cpu:?} CPU of the calling thread, lane up: {:?}, fell back: {}",
                c.l2_status().map(|s| s.0),
                c.l2_counters.fell_back.load(Ordering::Relaxed)
            );
            assert_eq!(got, data, "the read's data");
            assert!(
                cpu < Duration::from_millis(100),
                "a waiting caller spun {cpu:?} of CPU in a {wall:?} read whose data never came"
            );
        })
        .unwrap();
}

/// Writes larger than a lane request carries land in place: their blocks go as a
/// layer-2 transfer straight into the volume's blocks (the lane's memory is the volume's
/// image). Random sizes up to the most one landing write carries, at unaligned offsets,
/// between inline writes and reads, match a model; the counters show every large write
/// landed and nothing fell back.
#[test]
fn large_writes_land_in_the_volumes_blocks_and_match_a_model() {
    if !l2_ready() {
        return;
    }
    let n = net_landing("land", 64 << 20);
    let addr = n.addr.clone();
    let server = n.server();
    n.pair
        .cli
        .run(move || {
            let c = landing_client(&addr);
            let r = c.lane_report().unwrap();
            assert_eq!(r.counters["landed"], 0);
            let f = create(&c, "f");
            const FILE: usize = 4 << 20;
            let most = zcfs_protocol::l2::MAX_LANDING_WRITE as usize;
            let mut model = vec![0u8; FILE];
            let mut rng = Rng(0x1a2d);
            // The file's size first (its last byte, zero as in the model).
            write(&c, &f, FILE as u64 - 1, &[0]);
            let (mut landed, mut bytes) = (0u64, 0u64);
            for i in 0..120 {
                let len = match i % 4 {
                    // At the bounds: one byte past the inline writes, the most a
                    // landing write carries.
                    0 if i % 8 == 0 => MAX_WRITE as usize + 1,
                    0 => most,
                    1 => 1 + rng.below(MAX_WRITE as u64) as usize,
                    _ => {
                        MAX_WRITE as usize
                            + 1
                            + rng.below((most - MAX_WRITE as usize) as u64) as usize
                    }
                };
                let off = rng.below((FILE - len) as u64) as usize;
                let data: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
                if i % 5 == 3 {
                    // No handle: the server checks and holds the node itself.
                    let req: Request = WriteReq {
                        node: NodeRef::new(f.attr.ino, f.attr.generation),
                        fh: 0,
                        offset: off as u64,
                        size: len as u32,
                        commit: false,
                    }
                    .into();
                    c.call(&req, me(), &[&data]).unwrap();
                } else {
                    write(&c, &f, off as u64, &data);
                }
                model[off..off + len].copy_from_slice(&data);
                if len > MAX_WRITE as usize {
                    landed += 1;
                    bytes += len as u64;
                }
                // Read back around the write: its edges kept the neighbours' bytes.
                let from = off.saturating_sub(5000) / 4096 * 4096;
                let to = (off + len + 5000).min(FILE);
                let mut at = from;
                while at < to {
                    let k = (to - at).min(64 << 10);
                    let got = read(&c, &f, at as u64, k as u32);
                    let want = &model[at..at + k];
                    let bad = got.iter().zip(want).position(|(a, b)| a != b);
                    assert!(
                        got.len() == k && bad.is_none(),
                        "write {i} of {len} bytes at {off}: {} bytes read at {at}, first \
                         difference at {:?}",
                        got.len(),
                        bad.map(|b| at + b)
                    );
                    at += k;
                }
            }
            // The whole file, through a client on TCP only.
            let tcp = Client::new(ClientConfig::new(&addr));
            tcp.connect().unwrap();
            for at in (0..FILE).step_by(1 << 20) {
                let req: Request = ReadReq {
                    node: NodeRef::new(f.attr.ino, f.attr.generation),
                    fh: 0,
                    offset: at as u64,
                    size: 1 << 20,
                }
                .into();
                let got = tcp.call(&req, me(), &[]).unwrap().data;
                assert!(got == model[at..at + (1 << 20)], "bytes at {at} differ");
            }
            let r = c.lane_report().unwrap();
            assert_eq!(r.counters["landed"], landed, "{r:?}");
            assert_eq!(r.counters["landed_bytes"], bytes);
            assert_eq!(r.counters["fell_back"], 0);
            assert!(c.l2_status().unwrap().0, "the lane stayed up");
            // Every write rode the lane: inline or landing.
            assert_eq!(r.requests["write"].tcp, 0, "{r:?}");
        })
        .unwrap();
    let l2 = server.l2_requests();
    assert_eq!(l2[Op::Write as usize], 121, "{:?}", &l2[..]);
    drop(n);
}

/// A client that lands no writes (`land_max` 0) sends the large ones on TCP, and so
/// do one whose lane waits (poll(2)) and names no limit (`default_land_max`: none) and
/// one whose server's lane does not map its volume (an anonymous volume here: the
/// server offers no landing at set-up).
#[test]
fn writes_land_only_where_both_ends_can() {
    if !l2_ready() {
        return;
    }
    assert_eq!(zcfs_client::l2::default_land_max(L2Poll::Wait), 0);
    assert_eq!(
        zcfs_client::l2::default_land_max(L2Poll::Busy),
        zcfs_protocol::l2::MAX_LANDING_WRITE
    );
    for case in 0..3 {
        let landing_server = case < 2;
        let n = if landing_server {
            net_landing("noland", 64 << 20)
        } else {
            net("noland", true)
        };
        let addr = n.addr.clone();
        n.pair
            .cli
            .run(move || {
                let mut cfg = client_cfg(&addr, CLI_IF);
                let o = cfg.l2.as_mut().unwrap();
                match case {
                    0 => o.land_max = Some(0),
                    1 => (o.poll, o.land_max) = (L2Poll::Wait, None),
                    _ => o.land_max = Some(zcfs_protocol::l2::MAX_LANDING_WRITE),
                }
                let c = Client::new(cfg);
                c.connect().unwrap();
                assert!(c.l2_status().unwrap().0);
                let f = create(&c, "f");
                let data = vec![7u8; MAX_WRITE as usize + 1];
                write(&c, &f, 100, &data);
                assert!(read(&c, &f, 100, 4096) == data[..4096]);
                let r = c.lane_report().unwrap();
                assert_eq!(r.counters["landed"], 0, "{r:?}");
                assert_eq!(r.counters["fell_back"], 0, "{r:?}");
                assert_eq!(r.requests["write"].tcp, 1, "{r:?}");
            })
            .unwrap();
        drop(n);
    }
}

/// A session with a shared secret tags whole frames (header and payload), one without
/// tags the header and a keyed SipHash of the payload: both ends must choose alike, or
/// no command would verify. Reads and
/// writes of one command and of several (parts) ride the lane of an authenticated
/// session and match what was written.
#[test]
fn an_authenticated_lane_carries_reads_and_writes_in_parts() {
    if !l2_ready() {
        return;
    }
    const SECRET: &[u8] = b"a secret both ends share, 32 by.";
    let n = net_secret("auth", memory_fs(64 << 20), true, Some(SECRET));
    let addr = n.addr.clone();
    let server = n.server();
    n.pair
        .cli
        .run(move || {
            let mut cfg = client_cfg(&addr, CLI_IF);
            cfg.secret = Some(SECRET.to_vec());
            let c = Client::new(cfg);
            c.connect().unwrap();
            assert!(c.l2_status().expect("asked for").0, "the lane is up");
            let f = create(&c, "f");
            let sizes = [1usize, 1000, 4096, 5000, MAX_WRITE as usize];
            let mut at = 0u64;
            for (i, &len) in sizes.iter().enumerate() {
                let data: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
                write(&c, &f, at, &data);
                let mut got = Vec::new();
                while got.len() < len {
                    let want = (len - got.len()).min(4096) as u32;
                    got.extend(read(&c, &f, at + got.len() as u64, want));
                }
                assert_eq!(got, data, "{len} bytes");
                at += len as u64;
            }
            assert_eq!(l2_count(&c, Op::Write), sizes.len() as u64);
            assert_eq!(c.l2_counters.fell_back.load(Ordering::Relaxed), 0);
            let st = c.l2_endpoint_stats().unwrap();
            assert_eq!(st.refused, 0, "{st:?}");
        })
        .unwrap();
    assert_eq!(server.l2_requests()[Op::Write as usize], 5);
    drop(n);
}

/// Getattr of the root over a client for `iface`; whether the lane came up and how many
/// getattrs went over it.
fn probe(addr: &str, iface: &str) -> (Client, bool) {
    let c = Client::new(client_cfg(addr, iface));
    c.connect().unwrap();
    c.call(
        &GetattrReq {
            node: NodeRef::ino(ROOT),
        }
        .into(),
        me(),
        &[],
    )
    .unwrap();
    let up = c.l2_status().is_some_and(|(up, _)| up);
    (c, up)
}

/// Fallbacks: a server without --l2 refuses, an interface that does not exist fails
/// locally, and a second session while the first holds the client's interface fails
/// locally; each works over TCP. When the holder goes, the next session gets the lane
/// (the server's hold freed with the connection).
/// The client defers the ack of a reply (and the DONE of a read's data) for the next
/// request to carry; a caller that goes away with its answer leaves them to the lane's
/// flusher, which sends them within the ack delay. Without it the server would send
/// its reply again every RTO (5 ms) until the next request: duplicates at the client.
#[test]
fn an_idle_lane_acks_its_last_reply_so_the_server_does_not_send_it_again() {
    if !l2_ready() {
        return;
    }
    let n = net("idleack", true);
    let addr = n.addr.clone();
    n.pair
        .cli
        .run(move || {
            let c = Client::new(client_cfg(&addr, CLI_IF));
            c.connect().unwrap();
            let f = create(&c, "f");
            write(&c, &f, 0, &[5u8; 8192]);
            // Idle for 8 of the server's RTOs after each read: without the flusher the
            // server sends its last reply again about 7 times per round (seen: 7 in the
            // first). The flusher acks within rto/4; a loaded machine may still delay it
            // past one RTO now and then, so the bound is half of the no-flusher count.
            const ROUNDS: u64 = 3;
            for _ in 0..ROUNDS {
                assert_eq!(read(&c, &f, 0, 4096), vec![5u8; 4096]);
                std::thread::sleep(Duration::from_millis(40));
            }
            // The last idle time's duplicates are counted by this poll.
            assert_eq!(read(&c, &f, 4096, 4096), vec![5u8; 4096]);
            let dups = c.l2_endpoint_stats().unwrap().command_duplicates;
            assert!(
                dups < ROUNDS * 4,
                "the server sent its replies again {dups} times:\n{}",
                c.l2_debug_state().unwrap_or_default()
            );
            assert!(l2_count(&c, Op::Read) >= 4, "the reads rode the lane");
        })
        .unwrap();
}

#[test]
fn the_session_stays_on_tcp_when_the_lane_cannot_be_had() {
    if !l2_ready() {
        return;
    }
    let plain = net("nol2", false);
    let addr = plain.addr.clone();
    plain
        .pair
        .cli
        .run(move || {
            let (c, up) = probe(&addr, CLI_IF);
            assert!(!up, "a server without --l2 refuses the lane");
            assert_eq!(l2_count(&c, Op::Getattr), 0);
        })
        .unwrap();
    drop(plain);
    let n = net("busy", true);
    let addr = n.addr.clone();
    n.pair
        .cli
        .run(move || {
            let (c, up) = probe(&addr, "no-such-if0");
            assert!(!up, "a missing interface leaves the session on TCP");
            assert_eq!(l2_count(&c, Op::Getattr), 0);
            drop(c);
            let (first, up) = probe(&addr, CLI_IF);
            assert!(up);
            assert_eq!(l2_count(&first, Op::Getattr), 1);
            // A second session on the same client interface: its XDP program cannot
            // attach while the first holds the interface (a local failure; the
            // server's "busy" refusal needs a second client on another interface of
            // the segment, not covered here).
            let (second, up2) = probe(&addr, CLI_IF);
            assert!(
                !up2,
                "a second session while one holds the lane stays on TCP"
            );
            assert_eq!(l2_count(&second, Op::Getattr), 0);
            drop(second);
            // The holder goes: the next session gets the lane.
            drop(first);
            let mut up3 = false;
            for _ in 0..50 {
                let (third, up) = probe(&addr, CLI_IF);
                if up {
                    assert_eq!(l2_count(&third, Op::Getattr), 1);
                    up3 = true;
                    break;
                }
                drop(third);
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            assert!(up3, "the lane freed when its session ended");
        })
        .unwrap();
}

/// Figures for the record (run by hand with --ignored; nothing asserted on time): QD1
/// p50 of 4 KiB reads and 1, 4 and 16 KiB writes through the library, over layer 2 (wait mode)
/// and over TCP, on the same veth pair in one run.
#[test]
#[ignore]
fn qd1_latency_over_layer_2_and_tcp() {
    if !l2_ready() {
        return;
    }
    let n = net("qd1", true);
    let addr = n.addr.clone();
    n.pair
        .cli
        .run(move || {
            const N: usize = 5000;
            let l2 = lane_client(&addr);
            let tcp = Client::new(ClientConfig::new(&addr));
            let files = [create(&l2, "f"), create(&tcp, "g")];
            for (c, f) in [(&l2, &files[0]), (&tcp, &files[1])] {
                write(c, f, 0, &vec![7u8; 1 << 20]);
            }
            let p50 = |c: &Client, f: &CreateReply, what: &str, size: usize| {
                let mut t: Vec<u128> = (0..N)
                    .map(|i| {
                        let s = std::time::Instant::now();
                        if what == "read" {
                            read(c, f, (i % 256) as u64 * 4096, size as u32);
                        } else {
                            write(c, f, (i % 256) as u64 * 4096, &vec![i as u8; size]);
                        }
                        s.elapsed().as_nanos()
                    })
                    .collect();
                t.sort();
                t[N / 2] as f64 / 1000.0
            };
            for (what, size) in [
                ("read", 4096),
                ("write", 1024),
                ("write", 4096),
                ("write", 16384),
            ] {
                let (a, b) = (
                    p50(&l2, &files[0], what, size),
                    p50(&tcp, &files[1], what, size),
                );
                eprintln!(
                    "{what} {size}: l2 p50 {a:.1} us, tcp p50 {b:.1} us, ratio {:.2}",
                    a / b
                );
                eprintln!(
                    "{}",
                    l2.l2_debug_state()
                        .unwrap_or_default()
                        .lines()
                        .next()
                        .unwrap_or("")
                );
            }
        })
        .unwrap();
}

/// A Backend whose first statfs waits until the gate opens (at most 30 s): it holds
/// the server's layer-2 service thread, which runs lane requests one by one.
struct StallFirstStatfs {
    inner: Arc<dyn Backend>,
    /// (stalled, released)
    gate: Arc<(Mutex<(bool, bool)>, Condvar)>,
}

mod stall_impl {
    use super::StallFirstStatfs;
    use zcfs_backend::*;
    impl Backend for StallFirstStatfs {
        pass_on_the_rest!();
        pass_on! {
            lookup(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
            write_with(ctx: &Ctx, ino: u64, fh: u64, offset: u64, payload: &mut dyn WritePayload) -> Result<u32>;
        }
        fn statfs(&self) -> Result<StatFs> {
            let (m, cv) = &*self.gate;
            let mut st = m.lock().unwrap();
            if !st.0 {
                st.0 = true;
                st = super::stall_until(cv, st, |st| st.1);
            }
            drop(st);
            self.inner.statfs()
        }
    }
}

/// Review finding (review3): since 280453d a connection's `l2::Hold` gives the lane up
/// without waiting for the lane request that runs now (the old owner lock made the
/// connection's end wait for it). So at shutdown `Server::run` joins the connections
/// and releases every session (`Sessions::stop`: handles and references back to the
/// backend) while the service thread still executes a lane request of one of them
/// (and the same at the end of a session's grace): it then runs against a session
/// already released, and a handle it creates (open, create) is never given back.
/// Here: a lane statfs stalls at the server, the server is shut down, and
/// `Server::run` returns while the statfs still runs.
#[test]
fn the_server_releases_its_sessions_only_after_their_lane_requests_ended() {
    if !l2_ready() {
        return;
    }
    let gate = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let backend: Arc<dyn Backend> = Arc::new(StallFirstStatfs {
        inner: memory_fs(32 << 20),
        gate: gate.clone(),
    });
    let mut n = net_with("stopwait", backend, true);
    let addr = n.addr.clone();
    let client = n
        .pair
        .cli
        .spawn(move || {
            let c = Arc::new(lane_client(&addr));
            // Rides the lane and stalls at the server; fails once the server is gone.
            let _ = c.call(&StatfsReq {}.into(), me(), &[]);
            std::thread::sleep(Duration::from_secs(1));
        })
        .unwrap();
    {
        let (m, cv) = &*gate;
        let mut st = m.lock().unwrap();
        let t = Instant::now();
        while !st.0 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "statfs never arrived"
            );
            st = cv.wait_timeout(st, Duration::from_millis(20)).unwrap().0;
        }
    }
    // Shut down before the lane reply times out (1 s): the lane is still owned.
    let server = n.server();
    n.pair.srv.run(move || server.shutdown()).unwrap();
    let run = n.thread.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let joiner = std::thread::spawn(move || {
        let _ = run.join();
        let _ = tx.send(());
    });
    let returned_while_running = rx.recv_timeout(Duration::from_secs(2)).is_ok();
    {
        let (m, cv) = &*gate;
        m.lock().unwrap().1 = true;
        cv.notify_all();
    }
    joiner.join().unwrap();
    let _ = client.join();
    drop(n);
    assert!(
        !returned_while_running,
        "Server::run returned (every session released) while a lane request still ran"
    );
}

/// (From the review of the lane.) A request whose lane reply does not come within
/// L2_REPLY_TIMEOUT (the server's service thread busy with an earlier lane request) is
/// sent again on TCP with the same id, while its lane copy may still be queued at the
/// server. A write is in no reply cache, so that copy run late would put old bytes back
/// over newer ones (the finding: the file ended "AAAA" after "BBBB"). Writes ride the
/// lane since the client fences it first (`L2Release`, answered once no lane request
/// runs and none will). The service thread is let go only once the lane is down, so the
/// fence has to wait for it; afterwards the lane is set up again.
#[test]
fn a_write_resent_on_tcp_after_a_lane_timeout_is_not_executed_again_later() {
    if !l2_ready() {
        return;
    }
    let gate = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let backend: Arc<dyn Backend> = Arc::new(StallFirstStatfs {
        inner: memory_fs(32 << 20),
        gate: gate.clone(),
    });
    let n = net_with("rewrite", backend, true);
    let addr = n.addr.clone();
    let server = n.server();
    n.pair
        .cli
        .run(move || {
            let c = Arc::new(lane_client(&addr));
            let f = create(&c, "f");
            write(&c, &f, 0, b"old!");
            assert_eq!(l2_count(&c, Op::Write), 1, "a small write rides the lane");
            // A statfs on the lane holds the server's service thread.
            let c2 = c.clone();
            let stalled = std::thread::spawn(move || {
                c2.call(&StatfsReq {}.into(), me(), &[]).unwrap();
            });
            {
                let (m, cv) = &*gate;
                let mut st = m.lock().unwrap();
                let t = Instant::now();
                while !st.0 {
                    assert!(
                        t.elapsed() < Duration::from_secs(10),
                        "statfs never arrived"
                    );
                    st = cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
                }
            }
            // Lets the service thread go once the lane is down (the fence waits for it).
            let (c3, g) = (c.clone(), gate.clone());
            let opener = std::thread::spawn(move || {
                let t = Instant::now();
                while c3.l2_status().unwrap().0 && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                std::thread::sleep(Duration::from_millis(50));
                let (m, cv) = &*g;
                m.lock().unwrap().1 = true;
                cv.notify_all();
            });
            // Goes on the lane, times out (1 s), the lane is fenced, then it is resent
            // on TCP and executed there.
            write(&c, &f, 0, b"AAAA");
            assert!(!c.l2_status().unwrap().0, "the lane went down");
            // The session goes on on TCP: newer bytes at the same place.
            write(&c, &f, 0, b"BBBB");
            opener.join().unwrap();
            stalled.join().unwrap();
            assert_eq!(read(&c, &f, 0, 4), b"BBBB");
            // Time for a stale lane copy of the AAAA write to run, if it could.
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(
                String::from_utf8_lossy(&read(&c, &f, 0, 4)),
                "BBBB",
                "a lane write ran after the TCP resend and a newer write (lane writes at \
                 the server: {})",
                server.l2_requests()[Op::Write as usize]
            );
            assert!(server.l2_requests()[Op::Write as usize] <= 2);
            // The lane comes back after L2_RETRY_AFTER and carries requests again.
            std::thread::sleep(L2_RETRY_AFTER + Duration::from_millis(200));
            let before = l2_count(&c, Op::Read);
            assert_eq!(read(&c, &f, 0, 4), b"BBBB");
            assert!(
                c.l2_status().is_some_and(|s| s.0),
                "the lane is up again: {:?}",
                c.lane_report()
            );
            write(&c, &f, 0, b"CCCC");
            assert_eq!(read(&c, &f, 0, 4), b"CCCC");
            assert!(l2_count(&c, Op::Read) > before, "reads ride the new lane");
        })
        .unwrap();
    drop(n);
}

/// The lane in the stats of both ends (issue 12): bind mode, poll mode, up, and the
/// requests per operation on each path, in the reports and the Prometheus text; a
/// refused lane is down with the server's one-line reason.
#[test]
fn the_stats_show_the_lane_and_the_requests_per_path() {
    if !l2_ready() {
        return;
    }
    let n = net("stats", true);
    let addr = n.addr.clone();
    let server = n.server();
    n.pair
        .cli
        .run(move || {
            let c = Client::new(client_cfg(&addr, CLI_IF));
            c.connect().unwrap();
            let f = create(&c, "f");
            // One byte more than a layer-2 request carries: on TCP.
            write(&c, &f, 0, &[5u8; MAX_WRITE as usize + 1]);
            for _ in 0..3 {
                assert_eq!(read(&c, &f, 0, 4096), [5u8; 4096]);
            }
            let r = c.lane_report().expect("a lane was asked for");
            assert!(r.up, "{r:?}");
            assert_eq!(r.iface, CLI_IF);
            assert_eq!(r.bind_mode, "copy", "veth binds in copy mode");
            assert_eq!(r.poll, "wait");
            assert_eq!(r.reason, "");
            assert_eq!(r.requests["read"].l2, 3, "{r:?}");
            assert_eq!(r.requests["create"].l2, 1);
            assert_eq!(r.requests["write"].l2, 0, "a long write stays on TCP");
            assert_eq!(r.requests["write"].tcp, 1);
            assert_eq!(r.requests["l2setup"].tcp, 1);
            assert_eq!(r.counters["fell_back"], 0);
            let s = server.report().l2.expect("the server has a lane");
            assert!(s.up);
            assert_eq!((s.bind_mode.as_str(), s.poll.as_str()), ("copy", "wait"));
            assert_eq!(s.requests["read"].l2, 3, "{s:?}");
            assert_eq!(s.requests["write"].tcp, 1);
            assert_eq!(s.counters["accepted"], 1);
            let text = server.prometheus();
            for want in [
                "zcfs_server_l2_up 1\n",
                "zcfs_server_path_requests_total{op=\"read\",path=\"l2\"} 3\n",
                "zcfs_server_path_requests_total{op=\"write\",path=\"tcp\"} 1\n",
                "bind_mode=\"copy\",poll=\"wait\"",
            ] {
                assert!(text.contains(want), "{want} not in\n{text}");
            }
        })
        .unwrap();
    drop(n);
    let plain = net("stats-nol2", false);
    let addr = plain.addr.clone();
    let server = plain.server();
    plain
        .pair
        .cli
        .run(move || {
            let (c, up) = probe(&addr, CLI_IF);
            assert!(!up);
            let r = c.lane_report().unwrap();
            assert!(!r.up);
            assert_eq!(r.bind_mode, "", "no lane, no bind");
            assert!(
                r.reason.contains("the server refused"),
                "the refusal's one line: {:?}",
                r.reason
            );
            assert_eq!(
                r.requests["getattr"],
                zcfs_metrics::PathCounts { l2: 0, tcp: 1 }
            );
            assert!(server.report().l2.is_none(), "no lane on the server");
        })
        .unwrap();
}

/// Review finding (rv7): a read (no effect: it may run twice) caught on the lane when
/// it falls waits for the fence, and the fence (`L2Release`) waits at the server for the
/// slow lane request holding the service thread: the read takes as long as that
/// request (here a statfs held 4 s) rather than L2_REPLY_TIMEOUT and a TCP resend.
/// Before the fence such a read went to TCP at once; only writes and lseek need it.
#[test]
fn a_read_on_a_falling_lane_is_not_held_behind_the_fence() {
    if !l2_ready() {
        return;
    }
    let gate = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let backend: Arc<dyn Backend> = Arc::new(StallFirstStatfs {
        inner: memory_fs(32 << 20),
        gate: gate.clone(),
    });
    let n = net_with("fenceread", backend, true);
    let addr = n.addr.clone();
    n.pair
        .cli
        .run(move || {
            let c = Arc::new(lane_client(&addr));
            let f = create(&c, "f");
            write(&c, &f, 0, b"data");
            let c2 = c.clone();
            let stalled = std::thread::spawn(move || {
                c2.call(&StatfsReq {}.into(), me(), &[]).unwrap();
            });
            {
                let (m, cv) = &*gate;
                let mut st = m.lock().unwrap();
                let t = Instant::now();
                while !st.0 && t.elapsed() < Duration::from_secs(10) {
                    st = cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
                }
                assert!(st.0, "statfs never arrived");
            }
            // On the lane, behind the statfs: times out with it.
            let t = Instant::now();
            let c3 = c.clone();
            let reader = std::thread::spawn(move || {
                let got = read(&c3, &f, 0, 4);
                (got, t.elapsed())
            });
            std::thread::sleep(Duration::from_secs(4));
            let finished = reader.is_finished();
            {
                let (m, cv) = &*gate;
                m.lock().unwrap().1 = true;
                cv.notify_all();
            }
            let (got, took) = reader.join().unwrap();
            stalled.join().unwrap();
            assert_eq!(got, b"data");
            assert!(
                finished,
                "the read took {took:?}: held behind the fence for the whole stall"
            );
        })
        .unwrap();
    drop(n);
}

/// A Backend whose first mkdir runs and then waits until the gate opens (at most 30 s)
/// before it answers: the request has done its work at the server, and its reply is
/// late.
struct StallAfterFirstMkdir {
    inner: Arc<dyn Backend>,
    /// (ran, released)
    gate: Arc<(Mutex<(bool, bool)>, Condvar)>,
}

mod stall_mkdir_impl {
    use super::StallAfterFirstMkdir;
    use zcfs_backend::*;
    impl Backend for StallAfterFirstMkdir {
        pass_on_all_but_mkdir!();
        pass_on_lookup_and_io!();
        fn mkdir(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
            let r = self.inner.mkdir(ctx, parent, name, mode);
            let (m, cv) = &*self.gate;
            let mut st = m.lock().unwrap();
            if !st.0 {
                st.0 = true;
                drop(super::stall_until(cv, st, |st| st.1));
            }
            r
        }
    }
}

/// (Suspected by the lane's benchmark helper.) A request that falls off the lane goes
/// to TCP as if for the first time. A mkdir that ran at the server whose reply was lost
/// with the lane, sent on TCP into a new session after a server restart, runs again
/// there (EEXIST for a mkdir that did make the directory). TCP's own resend refuses
/// that for a non-idempotent request whose session changed: the lane's fallback must
/// too (a transport error, as the TCP path gives).
#[test]
fn a_mkdir_lost_with_the_lane_is_not_run_again_in_a_new_session() {
    if !l2_ready() {
        return;
    }
    let gate = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let inner = memory_fs(32 << 20);
    let backend: Arc<dyn Backend> = Arc::new(StallAfterFirstMkdir {
        inner: inner.clone(),
        gate: gate.clone(),
    });
    let mut n = net_with("mkdirtwice", backend, true);
    let addr = n.addr.clone();
    let c = Arc::new(
        n.pair
            .cli
            .run({
                let addr = addr.clone();
                move || {
                    let c = Client::new(client_cfg(&addr, CLI_IF));
                    c.connect().unwrap();
                    c
                }
            })
            .unwrap(),
    );
    assert!(c.l2_status().expect("the lane was set up").0);
    let c2 = c.clone();
    let mkdir = n
        .pair
        .cli
        .spawn(move || {
            c2.call(
                &zcfs_protocol::MkdirReq {
                    parent: NodeRef::ino(ROOT),
                    name: Name::new("d").unwrap(),
                    mode: 0o755,
                    umask: 0,
                }
                .into(),
                me(),
                &[],
            )
        })
        .unwrap();
    // The mkdir ran at the server; its reply waits. Once the lane is down (the client
    // fences it on TCP), the server goes and a new one takes its address.
    {
        let (m, cv) = &*gate;
        let mut st = m.lock().unwrap();
        let t = Instant::now();
        while !st.0 {
            assert!(t.elapsed() < Duration::from_secs(10), "mkdir never ran");
            st = cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
        }
    }
    let t = Instant::now();
    while c.l2_status().unwrap().0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!c.l2_status().unwrap().0, "the lane went down");
    n.restart(inner, || {
        let (m, cv) = &*gate;
        m.lock().unwrap().1 = true;
        cv.notify_all();
    });
    let r = mkdir.join().unwrap();
    match r {
        Ok(_) => {}
        // Any error of the link (the client's `is_transport`): "may or may not have
        // run". ECONNREFUSED too: the fence or the resend dialled while the server was
        // restarting (seen in about 1 of 30 runs under load).
        Err(e) => assert!(
            matches!(
                e.errno,
                libc::ETIMEDOUT
                    | libc::ENOTCONN
                    | libc::ECONNRESET
                    | libc::EPIPE
                    | libc::ECONNREFUSED
            ),
            "the mkdir ran twice: it made the directory, then failed with {e:?}"
        ),
    }
}

/// (Review rv9.) After the lane falls, requests "go to TCP at once" — but the server
/// runs one connection's requests one by one, and two of the client's connections are
/// now held by the stalled lane request: the fence (`L2Release` waits for the running
/// lane request, inline on its connection) and the TCP resend of the stalled request
/// itself (waiting in the reply cache's `begin` for its running lane copy). With the
/// default two connections every TCP request then waits for the whole stall (up to
/// the client timeout, which breaks the connection, and the redial waits too). Here
/// reads of a file after the lane went down, during a statfs held at the server.
#[test]
fn tcp_requests_after_the_lane_fell_are_not_held_behind_the_fence_on_their_connection() {
    if !l2_ready() {
        return;
    }
    let gate = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let backend: Arc<dyn Backend> = Arc::new(StallFirstStatfs {
        inner: memory_fs(32 << 20),
        gate: gate.clone(),
    });
    let n = net_with("fencehol", backend, true);
    let addr = n.addr.clone();
    n.pair
        .cli
        .run(move || {
            let c = Arc::new(lane_client(&addr));
            let f = create(&c, "f");
            write(&c, &f, 0, b"data");
            let c2 = c.clone();
            let stalled = std::thread::spawn(move || {
                c2.call(&StatfsReq {}.into(), me(), &[]).unwrap();
            });
            {
                let (m, cv) = &*gate;
                let mut st = m.lock().unwrap();
                let t = Instant::now();
                while !st.0 {
                    assert!(
                        t.elapsed() < Duration::from_secs(10),
                        "statfs never arrived"
                    );
                    st = cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
                }
            }
            let t = Instant::now();
            while c.l2_status().unwrap().0 && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(!c.l2_status().unwrap().0, "the lane went down");
            // The fence and the statfs's TCP resend are out.
            std::thread::sleep(Duration::from_millis(200));
            let c3 = c.clone();
            let reader = std::thread::spawn(move || {
                (0..4)
                    .map(|_| {
                        let req: Request = ReadReq {
                            node: NodeRef::new(f.attr.ino, f.attr.generation),
                            fh: f.fh,
                            offset: 0,
                            size: 4,
                        }
                        .into();
                        c3.call(&req, me(), &[]).map(|r| r.data)
                    })
                    .collect::<Vec<_>>()
            });
            // Far less than the client timeout (10 s), far more than 4 reads take.
            let t = Instant::now();
            while !reader.is_finished() && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let finished = reader.is_finished();
            {
                let (m, cv) = &*gate;
                m.lock().unwrap().1 = true;
                cv.notify_all();
            }
            let got = reader.join().unwrap();
            stalled.join().unwrap();
            assert!(
                finished,
                "4 reads on TCP did not finish in 5 s while a lane statfs was held at the \
                 server: held behind the fence / the statfs's resend ({got:?})"
            );
            for r in got {
                assert_eq!(r.unwrap(), b"data");
            }
        })
        .unwrap();
    drop(n);
}

/// (Review rv9.) A cached request (an unlink) that falls off the lane goes to TCP at
/// once now, while its lane copy is still queued at the server behind a slow lane
/// request; only the reply cache keeps that copy from running again. That cache is
/// bounded (REPLY_CACHE_ENTRIES, oldest evicted first) and the session goes on (on
/// connections not held by the fence): once enough cached requests have gone by, the
/// stale unlink runs when the service thread gets to it and removes the file made
/// again since. Before 5d6f9c9 a request that fell off waited for the fence first; it
/// does again (only requests free of effects go at once), so the unlinks do not return
/// before the stall ends and the test ends early with each unlink run once.
#[test]
fn a_request_that_fell_off_the_lane_does_not_run_again_after_its_reply_was_evicted() {
    if !l2_ready() {
        return;
    }
    let gate = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let backend: Arc<dyn Backend> = Arc::new(StallFirstStatfs {
        inner: memory_fs(32 << 20),
        gate: gate.clone(),
    });
    let n = net_with("evicted", backend, true);
    let addr = n.addr.clone();
    let server = n.server();
    n.pair
        .cli
        .run(move || {
            // Many connections, so that the session goes on beside the two the stalled
            // request holds (the fence, the statfs's resend); no reply times out.
            let mut cfg = client_cfg(&addr, CLI_IF);
            cfg.connections = 12;
            cfg.timeout = Duration::from_secs(40);
            let c = Arc::new(Client::new(cfg));
            c.connect().unwrap();
            assert!(c.l2_status().expect("the lane was set up").0);
            const FILES: usize = 8;
            for i in 0..FILES {
                create(&c, &format!("f{i}"));
            }
            let c2 = c.clone();
            let stalled = std::thread::spawn(move || {
                c2.call(&StatfsReq {}.into(), me(), &[]).unwrap();
            });
            {
                let (m, cv) = &*gate;
                let mut st = m.lock().unwrap();
                let t = Instant::now();
                while !st.0 {
                    assert!(
                        t.elapsed() < Duration::from_secs(10),
                        "statfs never arrived"
                    );
                    st = cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
                }
            }
            // Unlinks on the lane, queued behind the statfs: they time out with the
            // lane and go to TCP.
            let unlinkers: Vec<_> = (0..FILES)
                .map(|i| {
                    let c = c.clone();
                    std::thread::spawn(move || {
                        c.call(
                            &zcfs_protocol::UnlinkReq {
                                parent: NodeRef::ino(ROOT),
                                name: Name::new(format!("f{i}")).unwrap(),
                            }
                            .into(),
                            me(),
                            &[],
                        )
                    })
                })
                .collect();
            let t = Instant::now();
            while c.l2_status().unwrap().0 && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(!c.l2_status().unwrap().0, "the lane went down");
            std::thread::sleep(Duration::from_secs(1));
            // Those whose TCP copy ran (not queued behind a held connection).
            let unlinked: Vec<usize> = unlinkers
                .iter()
                .enumerate()
                .filter(|(_, u)| u.is_finished())
                .map(|(i, _)| i)
                .collect();
            if unlinked.is_empty() {
                // The unlinks wait for the fence (since the fix): none returns while
                // its lane copy may still run, so none can be overtaken by it. Let the
                // stall go; every unlink then succeeds exactly once.
                {
                    let (m, cv) = &*gate;
                    m.lock().unwrap().1 = true;
                    cv.notify_all();
                }
                stalled.join().unwrap();
                for u in unlinkers {
                    u.join().unwrap().expect("each unlink succeeds once");
                }
                return;
            }
            // Made again, each on its own thread (one that meets a held connection
            // waits for the stall: only those made before it ends count).
            let makers: Vec<_> = unlinked
                .iter()
                .map(|&i| {
                    let c = c.clone();
                    std::thread::spawn(move || {
                        create(&c, &format!("f{i}"));
                        i
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_secs(1));
            let (made, late): (Vec<_>, Vec<_>) = makers.into_iter().partition(|m| m.is_finished());
            let made: Vec<usize> = made.into_iter().map(|m| m.join().unwrap()).collect();
            assert!(!made.is_empty(), "no file was made again on TCP");
            // The session goes on past the reply cache's bound: threads of cached
            // requests, each until it meets a held connection.
            let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let want = zcfs_server::REPLY_CACHE_ENTRIES + 64;
            let flood: Vec<_> = (0..256)
                .map(|_| {
                    let (c, done) = (c.clone(), done.clone());
                    std::thread::spawn(move || {
                        for _ in 0..64 {
                            if done.load(Ordering::SeqCst) >= want {
                                return;
                            }
                            let r = c.call(
                                &GetattrReq {
                                    node: NodeRef::ino(ROOT),
                                }
                                .into(),
                                me(),
                                &[],
                            );
                            // Only those answered are in the reply cache.
                            if r.is_ok() {
                                done.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    })
                })
                .collect();
            let t = Instant::now();
            while done.load(Ordering::SeqCst) < want && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let went = done.load(Ordering::SeqCst);
            {
                let (m, cv) = &*gate;
                m.lock().unwrap().1 = true;
                cv.notify_all();
            }
            stalled.join().unwrap();
            for f in flood {
                f.join().unwrap();
            }
            for u in unlinkers {
                let _ = u.join().unwrap();
            }
            for m in late {
                m.join().unwrap();
            }
            // Time for the stale lane copies to run, if they can.
            std::thread::sleep(Duration::from_millis(500));
            let lane_unlinks = server.l2_requests()[Op::Unlink as usize];
            let gone: Vec<usize> = made
                .iter()
                .copied()
                .filter(|i| {
                    c.call(
                        &LookupReq {
                            parent: NodeRef::ino(ROOT),
                            name: LookupName::new(format!("f{i}")).unwrap(),
                        }
                        .into(),
                        me(),
                        &[],
                    )
                    .is_err()
                })
                .collect();
            assert!(
                gone.is_empty(),
                "files made again after their unlink returned were removed by the unlink's \
                 stale lane copy: {gone:?} of {made:?} (unlinks run from the lane: \
                 {lane_unlinks}; cached requests during the stall: {went})"
            );
        })
        .unwrap();
    drop(n);
}

/// A Backend whose first `write` once armed (the lane's buffered write; TCP writes
/// come by `write_with`) waits until the gate opens (at most 30 s) before it writes.
struct StallArmedLaneWrite {
    inner: Arc<dyn Backend>,
    gate: WriteGate,
}

/// (armed, stalled, released), and its condition variable.
type WriteGate = Arc<(Mutex<(bool, bool, bool)>, Condvar)>;

mod stall_write_impl {
    use super::StallArmedLaneWrite;
    use zcfs_backend::*;
    impl Backend for StallArmedLaneWrite {
        pass_on_all_but_write!();
        pass_on_lookup_and_io!();
        fn write(&self, ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
            let (m, cv) = &*self.gate;
            let mut st = m.lock().unwrap();
            if st.0 && !st.1 {
                st.1 = true;
                st = super::stall_until(cv, st, |st| st.2);
            }
            drop(st);
            self.inner.write(ctx, ino, fh, offset, data)
        }
    }
}

/// (Review rv9, suspected: `Client::submit` skips the lane's fence.) A small write on
/// the lane stalls at the server and fails at the client once its fence cannot be had
/// (each attempt times out): "may or may not have run", while its lane copy still
/// runs. A later write to the same bytes must not be overtaken by it: one sent with
/// `call` waits for the fence (and fails with it while the stall lasts). One sent with
/// `submit` (the FUSE mount's write-behind and pipelined writes) went to TCP at once,
/// succeeded, and was then overwritten by the stale lane write.
#[test]
fn a_submitted_write_is_not_overtaken_by_a_failed_lane_write() {
    if !l2_ready() {
        return;
    }
    let gate: WriteGate = Arc::new((Mutex::new((false, false, false)), Condvar::new()));
    let backend: Arc<dyn Backend> = Arc::new(StallArmedLaneWrite {
        inner: memory_fs(32 << 20),
        gate: gate.clone(),
    });
    let n = net_with("submitfence", backend, true);
    let addr = n.addr.clone();
    n.pair
        .cli
        .run(move || {
            let mut cfg = client_cfg(&addr, CLI_IF);
            // Each fence attempt gives up after this: the write fails in seconds.
            cfg.timeout = Duration::from_secs(2);
            let c = Arc::new(Client::new(cfg));
            c.connect().unwrap();
            assert!(c.l2_status().expect("the lane was set up").0);
            let f = create(&c, "f");
            write(&c, &f, 0, b"old!");
            assert_eq!(l2_count(&c, Op::Write), 1, "a small write rides the lane");
            gate.0.lock().unwrap().0 = true;
            let node = NodeRef::new(f.attr.ino, f.attr.generation);
            let req = |size| -> Request {
                WriteReq {
                    node,
                    fh: f.fh,
                    offset: 0,
                    size,
                    commit: false,
                }
                .into()
            };
            let t = Instant::now();
            let stale = c.call(&req(4), me(), &[b"AAAA"]);
            assert!(
                gate.0.lock().unwrap().1,
                "the lane write stalled at the server"
            );
            let e = stale.expect_err("the lane write fails while its fence cannot be had");
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "{:?}: {e:?}",
                t.elapsed()
            );
            // The caller goes on: newer bytes at the same place, not waited for.
            let newer = c
                .submit(&req(4), me(), &[b"BBBB"])
                .and_then(|ticket| ticket.wait());
            {
                let (m, cv) = &*gate;
                m.lock().unwrap().2 = true;
                cv.notify_all();
            }
            // Time for the stalled lane write to finish.
            std::thread::sleep(Duration::from_millis(500));
            let now = String::from_utf8_lossy(&read(&c, &f, 0, 4)).into_owned();
            match newer {
                Ok(_) => assert_eq!(
                    now, "BBBB",
                    "a write submitted after the lane write failed succeeded, and the \
                     stale lane write overwrote it"
                ),
                // Refused while the fence could not be had: the stale write landed.
                Err(e) => assert_eq!(now, "AAAA", "{e:?}"),
            }
        })
        .unwrap();
    drop(n);
}

/// (Review rv-s3 notes: `Client::post` skips the lane's fence, unlike `submit`; no harm
/// found, pinned here.) The client posts forget, and a release it could not send (the
/// only posted requests); neither rides the lane, and neither waits for its fence. Here
/// a lookup and a read of a file sit on the lane behind a stalled statfs when it falls,
/// and go again on TCP at once (free of effects), their lane copies still queued;
/// while the lane is down and its fence waits for the statfs, the client posts the
/// forget of every reference it counted and the release of the handle. Both are
/// answered at once, whatever the stall; once the fence is had the session holds no
/// reference and no handle, and the lookup ran once. (The fence, sent as the lane
/// fell, reaches the server first and drops the queued copies. A copy that ran after
/// a posted request, when the fence cannot be had, would meet only what it undid: a
/// lookup's reference is counted by the client only from a reply, so its copy is
/// answered from the reply cache; one on the handle gets EBADF, handles are never
/// numbered again in a session.)
#[test]
fn posted_forget_and_release_skip_the_lane_fence_and_undo_nothing() {
    if !l2_ready() {
        return;
    }
    let gate = Arc::new((Mutex::new((false, false)), Condvar::new()));
    let backend: Arc<dyn Backend> = Arc::new(StallFirstStatfs {
        inner: memory_fs(32 << 20),
        gate: gate.clone(),
    });
    let n = net_with("postfence", backend, true);
    let addr = n.addr.clone();
    let srv = n.server();
    n.pair
        .cli
        .run(move || {
            let c = Arc::new(lane_client(&addr));
            let f = create(&c, "f");
            write(&c, &f, 0, b"data");
            let (node, fh) = (NodeRef::new(f.attr.ino, f.attr.generation), f.fh);
            assert_eq!(srv.report().references_held, 1, "create's reference");
            assert_eq!(srv.report().handles_open, 1);
            let fell_back = || c.l2_counters.fell_back.load(Ordering::Relaxed);
            let fell = fell_back();
            let c2 = c.clone();
            let stalled = std::thread::spawn(move || {
                c2.call(&StatfsReq {}.into(), me(), &[]).unwrap();
            });
            {
                let (m, cv) = &*gate;
                let mut st = m.lock().unwrap();
                let t = Instant::now();
                while !st.0 && t.elapsed() < Duration::from_secs(10) {
                    st = cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
                }
                assert!(st.0, "statfs never arrived");
            }
            // On the lane behind the statfs: they time out with it and go again on
            // TCP at once (free of effects), their lane copies still queued.
            let c3 = c.clone();
            let lookup = std::thread::spawn(move || {
                c3.call(
                    &LookupReq {
                        parent: NodeRef::ino(ROOT),
                        name: LookupName::new("f").unwrap(),
                    }
                    .into(),
                    me(),
                    &[],
                )
                .unwrap();
            });
            let c4 = c.clone();
            let reader = std::thread::spawn(move || read(&c4, &f, 0, 4));
            lookup.join().unwrap();
            assert_eq!(reader.join().unwrap(), b"data");
            // Each caller counts its own fall back when it wakes: the statfs's thread,
            // though first to time out, may be scheduled last on a loaded machine.
            let t = Instant::now();
            while fell_back() - fell < 3 && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(
                fell_back() - fell,
                3,
                "the statfs, the lookup and the read fell off the lane"
            );
            assert!(
                !c.l2_status().expect("a lane").0,
                "the lane fell with the stalled statfs"
            );
            assert_eq!(srv.report().references_held, 2, "create's and the lookup's");
            // The kernel forgets both references and closes the file; the release is
            // posted as when it could not be sent.
            let t = Instant::now();
            let forget: Request = ForgetReq {
                items: List::new(vec![ForgetItem {
                    ino: node.ino,
                    count: 2,
                }])
                .unwrap(),
            }
            .into();
            c.post(&forget, me(), c.epoch());
            c.post(&ReleaseReq { node, fh }.into(), me(), c.epoch());
            while c.posted_unanswered() > 0 && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let took = t.elapsed();
            let held = *gate.0.lock().unwrap();
            assert_eq!(
                (c.posted_unanswered(), held),
                (0, (true, false)),
                "the posted requests were held {took:?}, behind the fence"
            );
            let r = srv.report();
            assert_eq!((r.references_held, r.handles_open), (0, 0));
            // Let the stale lane copies run (the stall ends, then the fence is had).
            {
                let (m, cv) = &*gate;
                m.lock().unwrap().1 = true;
                cv.notify_all();
            }
            stalled.join().unwrap();
            // The fence is answered once the statfs ends (no lane request of the
            // session runs after it), and the lane comes back after L2_RETRY_AFTER.
            let t = Instant::now();
            while !c.l2_status().expect("a lane").0 && t.elapsed() < Duration::from_secs(15) {
                c.call(
                    &GetattrReq {
                        node: NodeRef::ino(ROOT),
                    }
                    .into(),
                    me(),
                    &[],
                )
                .unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(c.l2_status().unwrap().0, "the lane did not come back");
            let r = srv.report();
            assert_eq!(
                (r.references_held, r.handles_open),
                (0, 0),
                "a stale lane copy put back what a posted request gave back"
            );
            assert_eq!(
                r.ops["lookup"].count, 1,
                "the lookup ran once (its lane copy was not run again)"
            );
            // And the file is as it was: a fresh lookup holds one reference again.
            let again = c
                .call(
                    &LookupReq {
                        parent: NodeRef::ino(ROOT),
                        name: LookupName::new("f").unwrap(),
                    }
                    .into(),
                    me(),
                    &[],
                )
                .unwrap();
            assert_eq!(again.hdr.status, 0);
            assert_eq!(srv.report().references_held, 1);
        })
        .unwrap();
    drop(n);
}

/// A backend whose first statfs stalls until released, and whose lane writes (the
/// lane calls `write`, TCP `write_with`) stall once armed, until released.
struct StallStatfsThenLaneWrite {
    inner: Arc<dyn Backend>,
    gate: PartsGate,
}

/// Statfs (stalled, released), lane write (armed, stalled, released).
#[derive(Default)]
struct PartsGateState {
    statfs: (bool, bool),
    write: (bool, bool, bool),
}
type PartsGate = Arc<(Mutex<PartsGateState>, Condvar)>;

mod stall_parts_impl {
    use super::StallStatfsThenLaneWrite;
    use zcfs_backend::*;
    impl Backend for StallStatfsThenLaneWrite {
        pass_on_all_but_write!();
        pass_on! {
            lookup(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
            write_with(ctx: &Ctx, ino: u64, fh: u64, offset: u64, payload: &mut dyn WritePayload) -> Result<u32>;
            flush(ino: u64, fh: u64) -> Result<()>;
        }
        fn statfs(&self) -> Result<StatFs> {
            let (m, cv) = &*self.gate;
            let mut st = m.lock().unwrap();
            if !st.statfs.0 {
                st.statfs.0 = true;
                st = super::stall_until(cv, st, |st| st.statfs.1);
            }
            drop(st);
            self.inner.statfs()
        }
        fn write(&self, ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
            let (m, cv) = &*self.gate;
            let mut st = m.lock().unwrap();
            if st.write.0 && !st.write.1 {
                st.write.1 = true;
                st = super::stall_until(cv, st, |st| st.write.2);
            }
            drop(st);
            self.inner.write(ctx, ino, fh, offset, data)
        }
    }
}

/// Wait (at most 10 s) until `f` holds of the gate's state.
fn wait_gate(gate: &PartsGate, what: &str, f: impl Fn(&PartsGateState) -> bool) {
    let (m, cv) = &**gate;
    let mut st = m.lock().unwrap();
    let t = Instant::now();
    while !f(&st) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what} never happened"
        );
        st = cv.wait_timeout(st, Duration::from_millis(20)).unwrap().0;
    }
}

/// Change the gate's state and wake its waiters.
fn set_gate(gate: &PartsGate, f: impl FnOnce(&mut PartsGateState)) {
    let (m, cv) = &**gate;
    f(&mut m.lock().unwrap());
    cv.notify_all();
}

/// (Review rvparts.) Long writes (in request parts, kind 4) caught on the lane when it
/// falls. A statfs holds the server's service thread while three MAX_WRITE writes are
/// queued behind it: more parts than the command window, so the third is only partly
/// sent. Then the first write, run once the statfs ends, stalls until the lane has
/// fallen and the server has given it up (fenced); the second completes after that and
/// the third's first parts are gathered. None of them runs late (a newer write stays),
/// and the gathered parts of the old lane do not spoil the next one: once it is set up
/// again long writes ride it, whole and at their place.
#[test]
fn long_writes_caught_in_parts_when_the_lane_falls_neither_run_late_nor_spoil_the_next_lane() {
    if !l2_ready() {
        return;
    }
    let gate: PartsGate = Arc::default();
    let backend: Arc<dyn Backend> = Arc::new(StallStatfsThenLaneWrite {
        inner: memory_fs(32 << 20),
        gate: gate.clone(),
    });
    let n = net_with("partsfall", backend, true);
    let addr = n.addr.clone();
    let server = n.server();
    n.pair
        .cli
        .run(move || {
            const LONG: usize = MAX_WRITE as usize;
            let c = Arc::new(lane_client(&addr));
            let f = create(&c, "f");
            write(&c, &f, 0, &[b'o'; LONG]);
            assert_eq!(l2_count(&c, Op::Write), 1, "a long write rides the lane");
            let c2 = c.clone();
            let stalled = std::thread::spawn(move || {
                c2.call(&StatfsReq {}.into(), me(), &[]).unwrap();
            });
            wait_gate(&gate, "the statfs stall", |s| s.statfs.0);
            let writers: Vec<_> = (0..3u8)
                .map(|i| {
                    let (c, f) = (c.clone(), f.clone());
                    std::thread::spawn(move || write(&c, &f, 0, &[b'A' + i; LONG]))
                })
                .collect();
            // The writes' parts go (a window's worth) and go again meanwhile.
            std::thread::sleep(Duration::from_millis(100));
            set_gate(&gate, |s| {
                s.write.0 = true;
                s.statfs.1 = true;
            });
            wait_gate(&gate, "the first lane write's stall", |s| s.write.1);
            let t = Instant::now();
            while c.l2_status().unwrap().0 && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(!c.l2_status().unwrap().0, "the lane went down");
            // The fence (sent as the lane fell) reaches the server; then the first
            // write ends and the service thread goes on with the parts behind it.
            std::thread::sleep(Duration::from_millis(100));
            set_gate(&gate, |s| s.write.2 = true);
            for w in writers {
                w.join().unwrap();
            }
            stalled.join().unwrap();
            write(&c, &f, 0, &[b'Z'; LONG]);
            // Time for a stale lane copy to run, if it could.
            std::thread::sleep(Duration::from_millis(300));
            let now = read(&c, &f, 0, LONG as u32);
            assert!(
                now.iter().all(|&b| b == b'Z'),
                "a lane write ran after the TCP resends and a newer write: {:?}...",
                String::from_utf8_lossy(&now[..16])
            );
            assert_eq!(
                server.l2_requests()[Op::Write as usize],
                2,
                "the first long write and the one that ran before the fence"
            );
            // The next lane: long writes ride it, whole and in place.
            std::thread::sleep(L2_RETRY_AFTER + Duration::from_millis(200));
            let _ = read(&c, &f, 0, 4);
            assert!(
                c.l2_status().is_some_and(|s| s.0),
                "the lane is up again: {:?}",
                c.lane_report()
            );
            let before = l2_count(&c, Op::Write);
            for (i, b) in [b'N', b'M'].into_iter().enumerate() {
                let off = (i * 100) as u64;
                write(&c, &f, off, &[b; LONG]);
                let got = read(&c, &f, off, LONG as u32);
                assert!(
                    got.iter().all(|&x| x == b),
                    "write {i} on the new lane came back as {:?}...",
                    String::from_utf8_lossy(&got[..16])
                );
            }
            assert_eq!(l2_count(&c, Op::Write), before + 2, "{:?}", c.lane_report());
            assert!(c.l2_status().is_some_and(|s| s.0), "{:?}", c.lane_report());
        })
        .unwrap();
    drop(n);
}

/// Figures, not a check (ignored): landing writes of 64 KiB, 256 KiB and 1 MiB against
/// the same writes on TCP, QD1, one server; p50/p90/p99/max and the lane's endpoint
/// counters. `ZCFS_TEST_L2_POLL=busy cargo test --release -p zcfs-server --test l2lane
/// landing_write_latency -- --ignored --nocapture`.
#[test]
#[ignore]
fn landing_write_latency_over_layer_2_and_tcp() {
    if !l2_ready() {
        return;
    }
    let n = net_landing("landlat", 256 << 20);
    let addr = n.addr.clone();
    n.pair
        .cli
        .run(move || {
            let l2 = landing_client(&addr);
            let tcp = Client::new(ClientConfig::new(&addr));
            tcp.connect().unwrap();
            let f = create(&l2, "f");
            let ops: usize = std::env::var("ZCFS_TEST_OPS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(300);
            for size in [64usize << 10, 256 << 10, 1 << 20] {
                let data = vec![0x3cu8; size];
                for (name, c) in [("l2", &l2), ("tcp", &tcp), ("l2", &l2), ("tcp", &tcp)] {
                    let mut lat = Vec::with_capacity(ops);
                    let t = Instant::now();
                    for i in 0..ops {
                        let off = (i % 64) as u64 * size as u64;
                        // No handle: the two clients are two sessions.
                        let req: Request = WriteReq {
                            node: NodeRef::new(f.attr.ino, f.attr.generation),
                            fh: 0,
                            offset: off,
                            size: size as u32,
                            commit: false,
                        }
                        .into();
                        let t0 = Instant::now();
                        c.call(&req, me(), &[&data]).unwrap();
                        lat.push(t0.elapsed().as_micros() as u64);
                    }
                    let el = t.elapsed();
                    lat.sort_unstable();
                    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
                    println!(
                        "{name:>3} write {:>5} KiB: p50 {:>6} p90 {:>6} p99 {:>6} max {:>7} us, {:>6.0} MB/s",
                        size >> 10,
                        q(0.5),
                        q(0.9),
                        q(0.99),
                        lat[lat.len() - 1],
                        (ops * size) as f64 / el.as_secs_f64() / 1e6
                    );
                }
            }
            println!("{:?}", l2.lane_report().unwrap().counters);
            println!("{}", l2.l2_debug_state().unwrap_or_default());
        })
        .unwrap();
    drop(n);
}
