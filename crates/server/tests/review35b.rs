//! Review 35b of 75f1311 (a waiting caller whose read is half in polls again at once,
//! yielding, for at most HALF_DONE_SPIN = 50 µs, then sleeps): the client library
//! against an in-process server, both lanes waiting in poll(2), over a two-queue veth
//! pair between two namespaces (root; skipped otherwise unless ZCFS_REQUIRE_L2=1).
//! Every loop is bounded in count and time.
//!
//! Run:
//!   ZCFS_REQUIRE_L2=1 cargo test --release -p zcfs-server --test review35b -- --nocapture

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config, l2_ready, memory_fs};
use zcfs_backend::ROOT;
use zcfs_client::l2::{L2Options, L2Poll};
use zcfs_client::{Caller, Client, ClientConfig};
use zcfs_netns::{owned_name, Pair, CLI_IF, SRV_IF};
use zcfs_protocol::{CreateReply, CreateReq, Name, NodeRef, Op, ReadReq, Reply, Request, WriteReq};
use zcfs_server::l2::L2Port;
use zcfs_server::Server;

struct Net {
    server: Arc<Server>,
    addr: String,
    thread: Option<std::thread::JoinHandle<()>>,
    pair: Pair,
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = self.pair.cli.ip(&["link", "set", CLI_IF, "mtu", "1500"]);
        let server = self.server.clone();
        let _ = self.pair.srv.run(move || server.shutdown());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn shm_image(len: usize) -> std::fs::File {
    let path = format!("/dev/shm/zcfs-rev35b-{}", std::process::id());
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

/// A server on a memory volume, its lane waiting in poll(2).
fn net(label: &str) -> Net {
    let backend = memory_fs(64 << 20);
    let image = shm_image(4 << 20);
    let pair = Pair::create_with_queues(&owned_name(std::process::id(), label), 93, 2).unwrap();
    let ip = pair.srv_ip;
    let (tx, rx) = std::sync::mpsc::channel();
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
            Caller::process(),
            &[],
        )
        .unwrap();
    match Reply::decode(Op::Create, &r.body).unwrap() {
        Reply::Create(c) => c,
        o => panic!("{o:?}"),
    }
}

fn read_req(f: &CreateReply, offset: u64, size: u32) -> Request {
    ReadReq {
        node: NodeRef::new(f.attr.ino, f.attr.generation),
        fh: f.fh,
        offset,
        size,
    }
    .into()
}

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// (Finding, 75f1311; the loop is older, 700d2bb.) The commit bounds the spin of a
/// waiting caller whose read has "its reply but not its data" to HALF_DONE_SPIN, then
/// sleeps. It never gets there: right after `poll_once`, `mine` (the reply is in) sends
/// the caller back to the top of the loop with the lane's lock held, where it polls
/// again: no yield, no sleep, no `half_since`. A read whose reply came and whose data
/// does not (here the client's veth drops the full-size data frames, the small reply
/// passes) makes its waiting caller spin flat out, holding the lane's mutex, until the
/// transfer is given up or L2_REPLY_TIMEOUT (1 s) takes the lane down. A waiting lane
/// that slept in poll(2) after HALF_DONE_SPIN would use a few ms of CPU in that time.
#[test]
fn a_waiting_read_with_its_reply_but_not_its_data_sleeps_after_the_half_done_spin() {
    if !l2_ready() {
        return;
    }
    let n = net("halfspin");
    let (addr, cli_ns) = (n.addr.clone(), &n.pair.cli);
    // The client in the client's namespace (CPU measured on that thread).
    n.pair
        .cli
        .run(move || {
        let mut cfg = ClientConfig::new(&addr);
        cfg.l2 = Some(L2Options {
            poll: L2Poll::Wait,
            ..L2Options::new(CLI_IF)
        });
        let c = Client::new(cfg);
        c.connect().unwrap();
        assert!(c.l2_status().expect("the lane was set up").0, "the lane is up");
        let f = create(&c, "f");
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let w: Request = WriteReq {
            node: NodeRef::new(f.attr.ino, f.attr.generation),
            fh: f.fh,
            offset: 0,
            size: data.len() as u32,
            commit: false,
        }
        .into();
        c.call(&w, Caller::process(), &[&data]).unwrap();
        // A read over the lane first: its data came, the lane is a good one.
        let before = c.l2_counters.requests[Op::Read as usize].load(std::sync::atomic::Ordering::Relaxed);
        let r = c.call(&read_req(&f, 0, 4096), Caller::process(), &[]).unwrap();
        assert_eq!(r.data, data);
        let after = c.l2_counters.requests[Op::Read as usize].load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(after, before + 1, "the first read went over the lane");

        // Full-size frames to the client are dropped from now on (the reply is small).
        cli_ns.ip(&["link", "set", CLI_IF, "mtu", "1000"]).unwrap();
        // Put back after 2.5 s, so that the read resent on TCP completes.
        let cli = zcfs_netns::Netns::open(cli_ns.name()).unwrap();
        let restore = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2500));
            cli.ip(&["link", "set", CLI_IF, "mtu", "1500"]).unwrap();
        });
        let (cpu0, t0) = (thread_cpu(), Instant::now());
        // Bounded: the lane gives up within L2_REPLY_TIMEOUT, and TCP goes on once the
        // MTU is back.
        let got = c.call(&read_req(&f, 0, 4096), Caller::process(), &[]);
        let (cpu, wall) = (thread_cpu() - cpu0, t0.elapsed());
        restore.join().unwrap();
        eprintln!(
            "read with its data dropped: {wall:?} wall, {cpu:?} CPU of the calling thread, lane up: {:?}, fell back: {}",
            c.l2_status().map(|s| s.0),
            c.l2_counters.fell_back.load(std::sync::atomic::Ordering::Relaxed)
        );
        assert_eq!(got.unwrap().data, data, "the read's data");
        assert!(
            cpu < Duration::from_millis(100),
            "a waiting caller spun {cpu:?} of CPU in a {wall:?} read whose data never came (HALF_DONE_SPIN is 50 µs)"
        );
        })
        .unwrap();
}
