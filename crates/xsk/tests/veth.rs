//! AF_XDP sockets and zcfs's XDP program on a real veth pair between two namespaces
//! (root; see common::l2_ready).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{complete_n, header, l2_ready, recv_n, Link};
use zcfs_netns::{CLI_IF, SRV_IF};
use zcfs_xsk::{
    AttachMode, BindMode, Desc, FrameIo, Region, XdpProgram, XskConfig, XskError, XskSocket,
    ETHERTYPE_COMMAND, ETHERTYPE_DATA, FILL_RING_SIZE, XDP_PACKET_HEADROOM,
};

const LIMIT: Duration = Duration::from_secs(10);
const CANARY: u8 = 0xCC;

/// The FrameIo contract on the real socket: frames land in fill order at fill + 256, the
/// headroom and the bytes after each frame untouched; completions give back the
/// transmitted addresses; the fill ring takes FILL_RING_SIZE entries and no more.
#[test]
fn frameio_contract_holds_on_a_real_socket() {
    if !l2_ready() {
        return;
    }
    let mut link = Link::new("xsk-contract");
    let rx_region = Arc::new(Region::anonymous(1 << 20).unwrap());
    rx_region.write(0, &vec![CANARY; 1 << 20]).unwrap();
    let tx_region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let mut srv = link.srv_socket(rx_region.clone(), 0);
    let mut cli = link.cli_socket(tx_region.clone(), 0);

    // Not sorted: the kernel takes them in posting order, not address order.
    let fills = [40_000u64, 8_192, 20_001];
    assert_eq!(srv.fill(&fills), 3);
    assert_eq!(srv.fill_free(), FILL_RING_SIZE as usize - 3);
    let lens = [1512u32, 60, 1000];
    // Even: kernel 6.18's copy mode returns an odd TX address with its low bit cleared
    // (see TX_ADDR_ALIGN).
    let tx_addrs = [100_000u64, 3_000, 300_334];
    let mut frames = Vec::new();
    for (i, (&addr, &len)) in tx_addrs.iter().zip(&lens).enumerate() {
        let mut f = vec![0u8; len as usize];
        f[..16].copy_from_slice(&header(
            link.srv.mac,
            link.cli.mac,
            ETHERTYPE_DATA,
            i as u16,
        ));
        for (j, b) in f[16..].iter_mut().enumerate() {
            *b = (i * 50 + j) as u8;
        }
        tx_region.write(addr, &f).unwrap();
        frames.push(f);
    }
    let descs: Vec<Desc> = tx_addrs
        .iter()
        .zip(&lens)
        .map(|(&addr, &len)| Desc { addr, len })
        .collect();
    assert_eq!(cli.transmit(&descs), 3);

    let got = recv_n(&mut srv, 3, LIMIT);
    assert_eq!(got.len(), 3, "three frames arrived");
    for (i, d) in got.iter().enumerate() {
        assert_eq!(
            d.addr,
            fills[i] + XDP_PACKET_HEADROOM,
            "frame {i} lands at fill + 256"
        );
        assert_eq!(d.len, lens[i]);
        let mut b = vec![0u8; d.len as usize];
        rx_region.read(d.addr, &mut b).unwrap();
        assert_eq!(b, frames[i], "frame {i}'s bytes");
        let mut head = vec![0u8; XDP_PACKET_HEADROOM as usize];
        rx_region.read(fills[i], &mut head).unwrap();
        assert!(
            head.iter().all(|&x| x == CANARY),
            "headroom of frame {i} untouched"
        );
        let mut after = [0u8; 64];
        rx_region.read(d.addr + d.len as u64, &mut after).unwrap();
        assert!(
            after.iter().all(|&x| x == CANARY),
            "bytes after frame {i} untouched"
        );
    }
    assert_eq!(
        srv.fill_free(),
        FILL_RING_SIZE as usize,
        "all fill entries consumed"
    );
    assert_eq!(complete_n(&mut cli, 3, LIMIT), tx_addrs.to_vec());

    // The fill ring's bound: FILL_RING_SIZE entries are taken, one more is not.
    let many: Vec<u64> = (0..=FILL_RING_SIZE as u64).map(|i| i * 128).collect();
    assert_eq!(srv.fill(&many), FILL_RING_SIZE as usize);
    assert_eq!(srv.fill_free(), 0);
    assert_eq!(srv.fill(&many[..1]), 0);
}

/// A frame sent on TX queue q of one veth end arrives on RX queue q of the other, whatever
/// its EtherType: commands and data are kept apart by queue. The two sockets of each end
/// share one UMEM (XDP_SHARED_UMEM), and other traffic (TCP) still passes the program.
#[test]
fn frames_sent_on_queue_q_arrive_on_queue_q() {
    if !l2_ready() {
        return;
    }
    let mut link = Link::new("xsk-queues");
    let srv_region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let cli_region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let srv0 = link.srv_socket(srv_region.clone(), 0);
    let srv1 = link
        .pair
        .srv
        .run(|| XskSocket::shared(&srv0, SRV_IF, 1, XskConfig::default()))
        .unwrap()
        .expect("a second socket sharing the UMEM");
    link.srv.prog.register(1, &srv1).unwrap();
    let same = link
        .pair
        .srv
        .run(|| XskSocket::shared(&srv0, SRV_IF, 0, XskConfig::default()))
        .unwrap();
    assert!(matches!(same, Err(XskError::SameQueue { queue: 0 })));
    let cli0 = link.cli_socket(cli_region.clone(), 0);
    let cli1 = link
        .pair
        .cli
        .run(|| XskSocket::shared(&cli0, CLI_IF, 1, XskConfig::default()))
        .unwrap()
        .unwrap();
    link.cli.prog.register(1, &cli1).unwrap();
    let (mut srv, mut cli) = ([srv0, srv1], [cli0, cli1]);
    let macs = [link.srv.mac, link.cli.mac];

    const PER_QUEUE: u64 = 8;
    // Both directions; each receiving socket posts its own part of the shared UMEM.
    for dir in 0..2 {
        let (rx, tx, rx_region, tx_region, dst, src) = if dir == 0 {
            (
                &mut srv,
                &mut cli,
                &srv_region,
                &cli_region,
                macs[0],
                macs[1],
            )
        } else {
            (
                &mut cli,
                &mut srv,
                &cli_region,
                &srv_region,
                macs[1],
                macs[0],
            )
        };
        for (q, s) in rx.iter_mut().enumerate() {
            let fills: Vec<u64> = (0..PER_QUEUE)
                .map(|i| (q as u64 * PER_QUEUE + i) * 4096)
                .collect();
            assert_eq!(s.fill(&fills), PER_QUEUE as usize);
        }
        // Queue 0 sends commands, queue 1 data: the EtherType does not steer, the queue does.
        for (q, s) in tx.iter_mut().enumerate() {
            let ethertype = [ETHERTYPE_COMMAND, ETHERTYPE_DATA][q];
            let descs: Vec<Desc> = (0..PER_QUEUE)
                .map(|i| {
                    let addr = 512 * 1024 + (q as u64 * PER_QUEUE + i) * 2048;
                    let tag = (dir * 100 + q * 10) as u16 + i as u16;
                    tx_region
                        .write(addr, &header(dst, src, ethertype, tag))
                        .unwrap();
                    Desc { addr, len: 64 }
                })
                .collect();
            assert_eq!(s.transmit(&descs), PER_QUEUE as usize);
            assert_eq!(
                complete_n(s, PER_QUEUE as usize, LIMIT).len(),
                PER_QUEUE as usize
            );
        }
        for (q, s) in rx.iter_mut().enumerate() {
            let got = recv_n(s, PER_QUEUE as usize, LIMIT);
            let mut tags = Vec::new();
            for d in &got {
                let mut h = [0u8; 16];
                rx_region.read(d.addr, &mut h).unwrap();
                tags.push(u16::from_be_bytes([h[14], h[15]]));
                let ethertype = u16::from_be_bytes([h[12], h[13]]);
                assert_eq!(ethertype, [ETHERTYPE_COMMAND, ETHERTYPE_DATA][q]);
            }
            let want: Vec<u16> = (0..PER_QUEUE)
                .map(|i| (dir * 100 + q * 10) as u16 + i as u16)
                .collect();
            assert_eq!(
                tags, want,
                "direction {dir}: queue {q} got its own queue's frames"
            );
            let mut none = Vec::new();
            assert_eq!(s.recv(&mut none, 1), 0, "nothing else arrived on queue {q}");
        }
    }

    // IP still passes: a TCP exchange across the link with both programs attached.
    let addr = std::net::SocketAddr::from((link.pair.srv_ip, 7801));
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let server = link
        .pair
        .srv
        .spawn(move || {
            let l = std::net::TcpListener::bind(addr).unwrap();
            ready_tx.send(()).unwrap();
            let (mut s, _) = l.accept().unwrap();
            std::io::Write::write_all(&mut s, b"tcp passes").unwrap();
        })
        .unwrap();
    ready.recv().unwrap();
    let got = link
        .pair
        .cli
        .run(|| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            let mut b = String::new();
            std::io::Read::read_to_string(&mut s, &mut b).unwrap();
            b
        })
        .unwrap();
    assert_eq!(got, "tcp passes");
    server.join().unwrap();
}

/// On veth the program attaches in driver mode and a socket binds in copy mode (zero-copy
/// is refused); the kernel's statistics are read back: frames that find no fill entry
/// are counted, not delivered.
#[test]
fn veth_binds_in_copy_mode_and_statistics_count_drops() {
    if !l2_ready() {
        return;
    }
    let mut link = Link::new("xsk-stats");
    assert_eq!(link.srv.prog.mode(), AttachMode::Driver);
    let srv_region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let cli_region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let mut srv = link.srv_socket(srv_region, 0);
    let mut cli = link.cli_socket(cli_region.clone(), 0);
    assert_eq!(srv.mode(), BindMode::Copy);
    assert_eq!(cli.mode(), BindMode::Copy);
    assert_eq!(srv.statistics().unwrap(), Default::default());

    const SENT: u64 = 5;
    let descs: Vec<Desc> = (0..SENT)
        .map(|i| {
            let h = header(link.srv.mac, link.cli.mac, ETHERTYPE_DATA, i as u16);
            cli_region.write(i * 2048, &h).unwrap();
            Desc {
                addr: i * 2048,
                len: 64,
            }
        })
        .collect();
    // No fill entries posted: every frame is dropped and counted.
    assert_eq!(cli.transmit(&descs), SENT as usize);
    assert_eq!(
        complete_n(&mut cli, SENT as usize, LIMIT).len(),
        SENT as usize
    );
    let t = std::time::Instant::now();
    let mut stats = srv.statistics().unwrap();
    while stats.rx_dropped < SENT && t.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(5));
        stats = srv.statistics().unwrap();
    }
    assert_eq!(stats.rx_dropped, SENT, "{stats:?}");
    assert!(stats.rx_fill_ring_empty_descs >= SENT, "{stats:?}");
    assert_eq!(stats.rx_invalid_descs, 0);
    let mut none = Vec::new();
    assert_eq!(srv.recv(&mut none, 8), 0);
    assert_eq!(cli.statistics().unwrap().tx_invalid_descs, 0);
}

/// A second XDP program on an interface is refused with a message; the first one's drop
/// detaches it, after which attaching works again.
#[test]
fn a_second_program_on_an_interface_is_refused_until_the_first_is_dropped() {
    if !l2_ready() {
        return;
    }
    let link = Link::new("xsk-twice");
    let again = link.pair.srv.run(|| XdpProgram::attach(SRV_IF)).unwrap();
    let err = again.expect_err("a second program on the interface");
    assert!(matches!(err, XskError::AlreadyAttached { .. }), "{err}");
    assert!(err.to_string().contains(SRV_IF), "{err}");
    let Link { srv, cli, pair } = link;
    drop(srv);
    let third = pair.srv.run(|| XdpProgram::attach(SRV_IF)).unwrap();
    assert!(
        third.is_ok(),
        "attach after the first program's drop: {third:?}"
    );
    drop((third, cli));
}

/// Attaching to, or binding on, an interface that does not exist says which.
#[test]
fn a_missing_interface_is_a_clear_error() {
    if !l2_ready() {
        return;
    }
    let name = "zcfs-no-such0";
    let err = XdpProgram::attach(name).unwrap_err();
    assert!(matches!(err, XskError::NoInterface { .. }), "{err}");
    assert!(err.to_string().contains(name), "{err}");
    let region = Arc::new(Region::anonymous(1 << 16).unwrap());
    let err = XskSocket::new(region, name, 0, XskConfig::default()).unwrap_err();
    assert!(err.to_string().contains(name), "{err}");
}

/// A TX frame at an address that is not a multiple of TX_ADDR_ALIGN is refused in
/// release builds too (its completion would come back one byte off): `try_transmit`
/// errs and queues nothing; `transmit` counts it as taken, never sends it and hands its
/// address back as a completion. At the bound (an aligned address) the frame goes.
#[test]
fn an_unaligned_tx_address_is_refused_at_the_bound() {
    if !l2_ready() {
        return;
    }
    let mut link = Link::new("xsk-txalign");
    let rx_region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let tx_region = Arc::new(Region::anonymous(1 << 20).unwrap());
    let mut srv = link.srv_socket(rx_region.clone(), 0);
    let mut cli = link.cli_socket(tx_region.clone(), 0);
    assert_eq!(srv.fill(&[8192, 16384]), 2);
    let f = header(link.srv.mac, link.cli.mac, ETHERTYPE_DATA, 1);
    let mut frame = f.to_vec();
    frame.resize(60, 0);
    let good = 4096 * zcfs_xsk::TX_ADDR_ALIGN;
    let odd = 2 * good + 1;
    tx_region.write(good, &frame).unwrap();
    tx_region.write(odd, &frame).unwrap();
    let d = |addr| Desc { addr, len: 60 };
    assert!(matches!(
        cli.try_transmit(&[d(good), d(odd)]),
        Err(XskError::UnalignedTx { addr, .. }) if addr == odd
    ));
    assert_eq!(cli.tx_refused(), 0, "try_transmit queued nothing");
    assert_eq!(cli.transmit(&[d(odd), d(good)]), 2);
    assert_eq!(cli.tx_refused(), 1);
    let mut done = complete_n(&mut cli, 2, LIMIT);
    done.sort_unstable();
    assert_eq!(done, [good, odd], "both addresses come back, unchanged");
    let got = recv_n(&mut srv, 1, LIMIT);
    assert_eq!(got.len(), 1, "only the aligned frame was sent");
    assert_eq!(got[0].addr, 8192 + XDP_PACKET_HEADROOM);
    assert_eq!(srv.fill_free(), FILL_RING_SIZE as usize - 1);
}
