//! Adversarial review of the layer-2 lane (review-lane): each test states a property
//! the lane should have and is ignored ("finding: ...") only while it fails. Veth pair
//! between two namespaces (root; skipped otherwise unless ZCFS_REQUIRE_L2=1), like
//! l2lane.rs. Every wait is bounded.

#[macro_use]
mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{config, memory_fs};
use zcfs_backend::{Backend, ROOT};
use zcfs_client::l2::{L2Options, L2Poll};
use zcfs_client::{Caller, Client, ClientConfig};
use zcfs_netns::{owned_name, Pair, CLI_IF, SRV_IF};
use zcfs_protocol::{
    CreateReply, CreateReq, LseekReq, Name, NodeRef, Op, ReadReq, Reply, Request, WriteReq,
};
use zcfs_server::l2::{L2Poll as SrvPoll, L2Port};
use zcfs_server::Server;

fn l2_ready() -> bool {
    let require = std::env::var("ZCFS_REQUIRE_L2").is_ok_and(|v| v == "1");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root && zcfs_xsk::xdp_object_available();
    assert!(
        ok || !require,
        "ZCFS_REQUIRE_L2=1 but not root or no XDP program"
    );
    if !ok {
        eprintln!("skipped: needs root and an XDP program");
    }
    ok
}

fn shm_image(label: &str, len: usize) -> std::fs::File {
    let path = format!("/dev/shm/zcfs-rvlane-{}-{label}", std::process::id());
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

fn net(label: &str, backend: Arc<dyn Backend>) -> Net {
    let pair = Pair::create_with_queues(&owned_name(std::process::id(), label), 83, 2).unwrap();
    let ip = pair.srv_ip;
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = pair
        .srv
        .spawn(move || {
            let mut cfg = config();
            cfg.listen = zcfs_transport::Address::Tcp(format!("{ip}:0"));
            let server = Arc::new(Server::bind(backend, cfg).unwrap());
            let image = shm_image("img", 4 << 20);
            let port = L2Port::open(SRV_IF, &image, SrvPoll::Wait).unwrap();
            server.start_l2(port, SrvPoll::Wait).unwrap();
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

fn client_cfg(addr: &str) -> ClientConfig {
    let mut c = ClientConfig::new(addr);
    c.l2 = Some(L2Options {
        poll: L2Poll::Wait,
        ..L2Options::new(CLI_IF)
    });
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

/// A request whose lane reply does not come within L2_REPLY_TIMEOUT (the server's
/// service thread busy with an earlier lane request) is sent again on TCP with the same
/// id, while its lane copy may still be queued at the server and run later. A write
/// (or lseek) is in no reply cache, so that late copy would put old bytes back over
/// newer ones (the finding, reproduced with a write stalled behind a held lseek: the
/// file ended "AAAA" after "BBBB"). Fixed by keeping writes and lseek off the lane
/// (`rides_l2`); this checks they stay on TCP while the lane is up and used, and that
/// the bytes are the newest after a stall of the service thread.
#[test]
fn a_write_resent_on_tcp_after_a_lane_timeout_is_not_executed_again_later() {
    if !l2_ready() {
        return;
    }
    let backend: Arc<dyn Backend> = memory_fs(32 << 20);
    let n = net("rewrite", backend);
    let addr = n.addr.clone();
    let server = n.server.clone();
    n.pair
        .cli
        .run(move || {
            let c = Arc::new(Client::new(client_cfg(&addr)));
            c.connect().unwrap();
            assert!(c.l2_status().expect("the lane was set up").0);
            let f = create(&c, "f");
            write(&c, &f, 0, b"old!");
            let lseek: Request = LseekReq {
                node: NodeRef::new(f.attr.ino, f.attr.generation),
                fh: f.fh,
                offset: 0,
                whence: libc::SEEK_DATA,
            }
            .into();
            c.call(&lseek, me(), &[]).unwrap();
            write(&c, &f, 0, b"AAAA");
            write(&c, &f, 0, b"BBBB");
            // The lane carried the reads and stayed up; no write or lseek rode it.
            assert_eq!(read(&c, &f, 0, 4), b"BBBB");
            assert!(c.l2_status().unwrap().0, "the lane stayed up");
            assert!(c.l2_counters.requests[Op::Read as usize].load(Ordering::Relaxed) >= 1);
            for op in [Op::Write, Op::Lseek] {
                assert_eq!(
                    c.l2_counters.requests[op as usize].load(Ordering::Relaxed),
                    0,
                    "{} rode the lane",
                    op.name()
                );
                assert_eq!(
                    server.l2_requests()[op as usize],
                    0,
                    "{} ran from the lane",
                    op.name()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(read(&c, &f, 0, 4), b"BBBB");
        })
        .unwrap();
    drop(n);
}
