//! Set-up shared by the veth tests and the l2bench example: a two-queue veth pair between
//! two namespaces with zcfs's XDP program on both ends, and an [`Endpoint`] per end over
//! two AF_XDP sockets (queue 0 data, queue 1 commands), each wrapped in the test tool
//! [`Lossy`]. The sockets are made inside the namespaces and driven from the caller's
//! threads (a socket stays in the namespace it was made in).

#![allow(dead_code)]

use std::sync::Arc;

use zcfs_l2::endpoint::{CMD_CHUNK, CMD_REGION_LEN};
use zcfs_l2::inject::{Lossy, LossyHandle};
use zcfs_l2::{Config, Endpoint};
use zcfs_netns::{owned_name, Pair, CLI_IF, SRV_IF};
use zcfs_xsk::{
    mac_address, xdp_object_available, Region, XdpProgram, XskConfig, XskError, XskSocket,
};

pub type Io = Lossy<XskSocket>;
pub type Ep = Endpoint<Io, Io>;

/// Chunks of the data region's staging area the endpoint sends from.
pub const TX_CHUNKS: u32 = 1024;
/// The staging area behind a data file: the scratch chunks and a chunk of slack (a fill
/// address needs UMEM_CHUNK_SIZE bytes of region behind it).
pub const STAGING: usize = TX_CHUNKS as usize * CMD_CHUNK as usize + 4096;
/// The command region: the endpoint's chunks, then chunks for a test's neighbour frames.
pub const NEIGHBOUR_CHUNKS: u64 = 16;
pub const CMD_LEN: usize = CMD_REGION_LEN + (NEIGHBOUR_CHUNKS * CMD_CHUNK) as usize;

/// Whether the layer-2 tests can run: root and a build with the XDP program. Without
/// them the tests pass vacuously, unless ZCFS_REQUIRE_L2=1 (CI), where they fail.
pub fn l2_ready() -> bool {
    let require = std::env::var("ZCFS_REQUIRE_L2").is_ok_and(|v| v == "1");
    if !xdp_object_available() {
        assert!(
            !require,
            "ZCFS_REQUIRE_L2=1 but zcfs-xsk was built without clang (no XDP program)"
        );
        eprintln!("skipped: built without clang");
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(!require, "ZCFS_REQUIRE_L2=1 but not running as root");
        eprintln!("skipped: not root");
        return false;
    }
    true
}

/// One end of the link: its program (attached while this lives) and MAC.
pub struct End {
    pub prog: XdpProgram,
    pub mac: [u8; 6],
}

/// Two namespaces joined by a two-queue veth pair (removed on drop), zcfs's XDP program
/// on both ends.
pub struct Link {
    // Programs first: detached before the namespaces go.
    pub srv: End,
    pub cli: End,
    pub pair: Pair,
}

impl Link {
    pub fn new(label: &str) -> Link {
        let pair = Pair::create_with_queues(&owned_name(std::process::id(), label), 78, 2)
            .expect("creating the veth pair");
        let end = |ns: &zcfs_netns::Netns, ifname: &'static str| {
            ns.run(move || End {
                prog: XdpProgram::attach(ifname).expect("attaching the XDP program"),
                mac: mac_address(ifname).expect("reading the MAC"),
            })
            .expect("entering the namespace")
        };
        let srv = end(&pair.srv, SRV_IF);
        let cli = end(&pair.cli, CLI_IF);
        Link { srv, cli, pair }
    }

    /// The data (queue 0) and command (queue 1, own UMEM of [`CMD_LEN`] bytes) sockets
    /// of one end, registered with its program.
    pub fn sockets(
        &mut self,
        server: bool,
        data: Arc<Region>,
        busy: bool,
    ) -> (XskSocket, XskSocket) {
        let (ns, end, ifname) = if server {
            (&self.pair.srv, &mut self.srv, SRV_IF)
        } else {
            (&self.pair.cli, &mut self.cli, CLI_IF)
        };
        let cfg = XskConfig {
            busy_poll: busy,
            ..XskConfig::default()
        };
        let cmd = Arc::new(Region::anonymous(CMD_LEN).expect("command region"));
        let (d, c) = ns
            .run(move || {
                let d = bind_retrying(|| XskSocket::new(data.clone(), ifname, 0, cfg));
                let c = bind_retrying(|| XskSocket::new(cmd.clone(), ifname, 1, cfg));
                (d, c)
            })
            .expect("entering the namespace");
        end.prog
            .register(0, &d)
            .expect("registering the data socket");
        end.prog
            .register(1, &c)
            .expect("registering the command socket");
        (d, c)
    }

    pub fn macs(&self, server: bool) -> ([u8; 6], [u8; 6]) {
        if server {
            (self.srv.mac, self.cli.mac)
        } else {
            (self.cli.mac, self.srv.mac)
        }
    }
}

/// Make a socket, trying again while its queue is busy (zcfs_xsk::bind_retrying).
fn bind_retrying(make: impl FnMut() -> Result<XskSocket, XskError>) -> XskSocket {
    zcfs_xsk::bind_retrying(make).expect("socket")
}

/// An endpoint and the test's handles on its two lossy wrappers.
pub struct Peer {
    pub ep: Ep,
    pub data: LossyHandle,
    pub cmd: LossyHandle,
}

/// Timings of the endpoints on the real link (nanoseconds).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub rto_ns: u64,
    pub quiet_ns: u64,
    pub transfer_timeout_ns: u64,
}

pub const TIMING: Timing = Timing {
    rto_ns: 5_000_000,
    quiet_ns: 1_000_000,
    transfer_timeout_ns: 10_000_000_000,
};

/// An endpoint of one end over `data` (whose staging area starts at `scratch`) with
/// faults at `ppm` each of loss, duplication and reordering (seeded) in both queues.
#[allow(clippy::too_many_arguments)]
pub fn peer(
    link: &mut Link,
    server: bool,
    data: Arc<Region>,
    scratch: u64,
    key: &[u8],
    seed: u64,
    ppm: u32,
    timing: Timing,
    busy: bool,
) -> Peer {
    let (d, c) = link.sockets(server, data, busy);
    let d = Lossy::new(d, seed, ppm, ppm, ppm);
    let c = Lossy::new(c, seed ^ 0x5555, ppm, ppm, ppm);
    let (local_mac, peer_mac) = link.macs(server);
    let (dh, ch) = (d.handle(), c.handle());
    let cfg = Config {
        local_mac,
        peer_mac,
        rto_ns: timing.rto_ns,
        quiet_ns: timing.quiet_ns,
        transfer_timeout_ns: timing.transfer_timeout_ns,
        credit_frames: zcfs_l2::endpoint::MAX_CREDIT_FRAMES,
        tx_scratch: (scratch, TX_CHUNKS),
        open_tags: false,
    };
    Peer {
        ep: Endpoint::new(cfg, key, d, c).expect("endpoint"),
        data: dh,
        cmd: ch,
    }
}

/// A second, independent read-only mapping of a file: what is read through it is in the
/// file, not only in the UMEM mapping.
pub struct SecondMapping {
    ptr: *const u8,
    len: usize,
}

impl SecondMapping {
    pub fn new(file: &std::fs::File, len: usize) -> SecondMapping {
        use std::os::unix::io::AsRawFd;
        // SAFETY: a fresh read-only shared mapping of the file, checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "second mapping");
        SecondMapping {
            ptr: p as *const u8,
            len,
        }
    }

    /// Copy `buf.len()` bytes at `off` out of the mapping.
    pub fn read(&self, off: usize, buf: &mut [u8]) {
        assert!(off + buf.len() <= self.len);
        // SAFETY: in bounds (checked); a raw copy, as the kernel may write other parts of
        // the file meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), buf.as_mut_ptr(), buf.len()) };
    }
}

impl Drop for SecondMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping of this length.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Pseudo-random bytes from `seed`.
pub fn pattern(seed: u64, out: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// A /dev/shm file of `len` bytes holding `content(len)`, removed from the directory at
/// once (it lives while open).
pub fn shm_file(label: &str, content: &[u8]) -> std::fs::File {
    use std::io::Write;
    let path = format!("/dev/shm/zcfs-l2-test-{}-{label}", std::process::id());
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f.write_all(content).unwrap();
    f
}
