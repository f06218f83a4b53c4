//! Shared set-up of the AF_XDP tests: a veth pair with two queues between two namespaces,
//! zcfs's XDP program on both ends, sockets made inside the namespaces and driven from
//! the test's thread (a socket stays in the namespace it was made in).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use zcfs_netns::{owned_name, Pair, CLI_IF, SRV_IF};
use zcfs_xsk::{
    mac_address, xdp_object_available, Desc, FrameIo, Region, XdpProgram, XskConfig, XskSocket,
};

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

/// Two namespaces joined by a two-queue veth pair, zcfs's XDP program on both ends.
pub struct Link {
    // Programs first: detached before the namespaces go.
    pub srv: End,
    pub cli: End,
    pub pair: Pair,
}

impl Link {
    pub fn new(label: &str) -> Link {
        let pair = Pair::create_with_queues(&owned_name(std::process::id(), label), 77, 2)
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

    /// A socket on `queue` of the server end, registered with its program.
    pub fn srv_socket(&mut self, region: Arc<Region>, queue: u32) -> XskSocket {
        let s = self
            .pair
            .srv
            .run(|| XskSocket::new(region, SRV_IF, queue, XskConfig::default()))
            .unwrap()
            .expect("server socket");
        self.srv.prog.register(queue, &s).unwrap();
        s
    }

    /// A socket on `queue` of the client end, registered with its program.
    pub fn cli_socket(&mut self, region: Arc<Region>, queue: u32) -> XskSocket {
        let s = self
            .pair
            .cli
            .run(|| XskSocket::new(region, CLI_IF, queue, XskConfig::default()))
            .unwrap()
            .expect("client socket");
        self.cli.prog.register(queue, &s).unwrap();
        s
    }
}

/// The 16-byte zcfs test header: destination, source, EtherType, and a 2-byte field.
pub fn header(dst: [u8; 6], src: [u8; 6], ethertype: u16, field: u16) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..6].copy_from_slice(&dst);
    h[6..12].copy_from_slice(&src);
    h[12..14].copy_from_slice(&ethertype.to_be_bytes());
    h[14..16].copy_from_slice(&field.to_be_bytes());
    h
}

/// Receive until `n` frames arrived or `limit` passed; returns what arrived.
pub fn recv_n(s: &mut XskSocket, n: usize, limit: Duration) -> Vec<Desc> {
    let mut got = Vec::new();
    let t = Instant::now();
    while got.len() < n && t.elapsed() < limit {
        let want = n - got.len();
        if s.recv(&mut got, want) == 0 {
            s.wait(Duration::from_millis(10)).unwrap();
        }
    }
    got
}

/// Wait until `n` transmitted frames completed or `limit` passed; returns their addresses.
pub fn complete_n(s: &mut XskSocket, n: usize, limit: Duration) -> Vec<u64> {
    let mut got = Vec::new();
    let t = Instant::now();
    while got.len() < n && t.elapsed() < limit {
        let want = n - got.len();
        if s.completions(&mut got, want) == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    got
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

/// A /dev/shm file of `len` bytes filled with `byte`, removed from the directory at once.
pub fn shm_file(label: &str, len: usize, byte: u8) -> std::fs::File {
    use std::io::Write;
    let path = format!("/dev/shm/zcfs-xsk-test-{}-{label}", std::process::id());
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    let chunk = vec![byte; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        f.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    f
}
