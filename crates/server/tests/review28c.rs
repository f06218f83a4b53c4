//! Review 28c of a5cc8fe (a waiting lane polls again at once while `tx_pending`) and
//! 44076fc (a transmit kicks the kernel again): the client library against a server
//! whose lane memory is its volume's image, over a two-queue veth pair between two
//! namespaces (root; skipped otherwise unless ZCFS_REQUIRE_L2=1). Every loop is
//! bounded in count and time.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config, l2_ready};
use zcfs_client::l2::{L2Options, L2Poll};
use zcfs_client::{Caller, Client, ClientConfig};
use zcfs_netns::{owned_name, Pair, CLI_IF, SRV_IF};
use zcfs_protocol::l2::MAX_LANDING_WRITE;
use zcfs_protocol::{CreateReply, CreateReq, Name, NodeRef, Op, Reply, Request, WriteReq};
use zcfs_server::l2::L2Port;
use zcfs_server::Server;
use zcfs_volume::ROOT_INO;

/// A server (lane waiting in poll(2)) whose backend is a fresh volume on a /dev/shm
/// image (removed from the directory at once), its lane's memory that same image.
struct Net {
    server: Arc<Server>,
    addr: String,
    thread: Option<std::thread::JoinHandle<()>>,
    pair: Pair,
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = self.pair.link(true);
        let server = self.server.clone();
        let _ = self.pair.srv.run(move || server.shutdown());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn net_landing(label: &str, size: u64) -> Net {
    let root = zcfs_volume::RootDir {
        uid: 0,
        gid: 0,
        mode: 0o755,
    };
    let (vol, image) = common::shm_volume(label, size, 4 << 20, root);
    let backend = Arc::new(zcfs_local::LocalFs::new(vol));
    let pair = Pair::create_with_queues(&owned_name(std::process::id(), label), 87, 2).unwrap();
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

/// CPU time (user + system) a thread used so far, by its pthread id.
fn thread_cpu(t: libc::pthread_t) -> Duration {
    let mut clk: libc::clockid_t = 0;
    // SAFETY: `t` is a live thread (the caller keeps it running) and `clk` is ours.
    assert_eq!(unsafe { libc::pthread_getcpuclockid(t, &mut clk) }, 0);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and our timespec.
    assert_eq!(unsafe { libc::clock_gettime(clk, &mut ts) }, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// (Finding, a5cc8fe.) A client whose lane waits in poll(2) and that lands writes
/// (`land_max` given) has its lane's link cut while a 1 MiB landing write sends its
/// data (720 frames through 128 TX chunks): the frames it gave the kernel never
/// complete (ENETDOWN), so `Endpoint::tx_pending` stays true (the next granted group
/// waits for chunks) and the waiting caller polls again at once on `yield_now` until
/// its `L2_REPLY_TIMEOUT` (1 s) — a core at 100 % on a 2-vCPU machine — where before it
/// slept in poll(2) between 1 ms slices. Here the writer's CPU time while the link is
/// down must stay that of a sleeper. The cut lands in the data phase of a write by
/// chance (most of a landing write's time); up to `ATTEMPTS` cuts are made.
#[test]
fn a_waiting_client_does_not_spin_while_its_landing_data_cannot_leave() {
    if !l2_ready() {
        return;
    }
    const ATTEMPTS: usize = 4;
    const WINDOW: Duration = Duration::from_millis(600);
    let n = net_landing("spin", 64 << 20);
    let addr = n.addr.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop2, writes2) = (stop.clone(), writes.clone());
    let writer = n
        .pair
        .cli
        .spawn(move || {
            let mut cfg = ClientConfig::new(&addr);
            cfg.timeout = Duration::from_secs(3);
            let mut o = L2Options::new(CLI_IF);
            o.poll = L2Poll::Wait;
            o.land_max = Some(MAX_LANDING_WRITE);
            cfg.l2 = Some(o);
            let c = Arc::new(Client::new(cfg));
            c.connect().unwrap();
            assert!(c.l2_status().unwrap().0, "the lane is up");
            let f = create(&c, "f");
            // SAFETY: pthread_self has no preconditions.
            tx.send((unsafe { libc::pthread_self() } as u64, c.clone()))
                .unwrap();
            let data = vec![0x5a; MAX_LANDING_WRITE as usize];
            let req: Request = WriteReq {
                node: NodeRef::new(f.attr.ino, f.attr.generation),
                fh: f.fh,
                offset: 0,
                size: data.len() as u32,
                commit: false,
            }
            .into();
            let t = Instant::now();
            while !stop2.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(60) {
                let _ = c.call(&req, Caller::process(), &[&data]);
                writes2.fetch_add(1, Ordering::SeqCst);
            }
        })
        .unwrap();
    let (tid, c) = rx.recv().unwrap();
    let tid = tid as libc::pthread_t;
    let landed = || c.l2_counters.landed.load(Ordering::Relaxed);
    let mut worst = (Duration::ZERO, 0usize);
    let t0 = Instant::now();
    for attempt in 0..ATTEMPTS {
        // The lane up and landing writes going (bounded: 15 s).
        let before = landed();
        let t = Instant::now();
        while !(c.l2_status().is_some_and(|s| s.0) && landed() >= before + 5)
            && t.elapsed() < Duration::from_secs(15)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            landed() >= before + 5,
            "attempt {attempt}: no landing writes"
        );
        n.pair.link(false).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let cpu0 = thread_cpu(tid);
        std::thread::sleep(WINDOW);
        let used = thread_cpu(tid) - cpu0;
        n.pair.link(true).unwrap();
        eprintln!(
            "attempt {attempt}: the writer used {used:?} of CPU in {WINDOW:?} with the link down"
        );
        if used > worst.0 {
            worst = (used, attempt);
        }
        if used > WINDOW / 2 {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    eprintln!(
        "{} writes, {} landed, {:?}",
        writes.load(Ordering::SeqCst),
        landed(),
        t0.elapsed()
    );
    drop(c);
    drop(n);
    assert!(
        worst.0 < WINDOW / 5,
        "a caller waiting (poll(2)) on a lane whose link is down burned {:?} of CPU in \
         {WINDOW:?} (attempt {}): it polls again at once while its data frames cannot go",
        worst.0,
        worst.1
    );
}
