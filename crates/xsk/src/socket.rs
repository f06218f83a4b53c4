//! An AF_XDP socket over `libc`: UMEM registration (unaligned chunks, so a frame may be
//! posted at any address), the four rings mapped into our memory, bind (zero-copy first,
//! then copy), statistics, and [`FrameIo`] on top.
//!
//! The rings are single-producer/single-consumer queues shared with the kernel. Each has
//! a producer and a consumer index (free-running u32s) in the mapped page. The side that
//! produces writes its entries, then publishes them with a Release store of the producer
//! index; the side that consumes reads the producer index with Acquire before it reads
//! the entries, and hands them back with a Release store of the consumer index (which the
//! producer reads with Acquire before it reuses the slots). This is the ordering the
//! kernel's `xsk_queue.h` documents (its smp_load_acquire/smp_store_release pairs).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{Desc, FrameIo, Region, XskError};

/// The UMEM chunk size: the most a frame posted at a fill address may occupy
/// (XDP_PACKET_HEADROOM + the frame). The kernel requires a fill address `a` to satisfy
/// `a + UMEM_CHUNK_SIZE <= region length`.
pub const UMEM_CHUNK_SIZE: u32 = 4096;
/// Entries in the fill ring (a power of two).
pub const FILL_RING_SIZE: u32 = 4096;
/// Entries in the completion ring (a power of two).
pub const COMPLETION_RING_SIZE: u32 = 2048;
/// Entries in the RX ring (a power of two).
pub const RX_RING_SIZE: u32 = 4096;
/// Entries in the TX ring (a power of two).
pub const TX_RING_SIZE: u32 = 2048;
/// Kicks one `transmit` makes at most while the kernel takes more of the frames it put
/// in the ring (copy mode sends 32 per kick: 64 kicks cover a full TX ring).
pub const MAX_KICKS_PER_TRANSMIT: u32 = TX_RING_SIZE / 32;
/// The kernel's shift of the offset in an unaligned-mode RX address
/// (`XSK_UNALIGNED_BUF_OFFSET_SHIFT`): the low 48 bits are the fill address, the high 16
/// the offset from it to the frame's first byte.
pub const UNALIGNED_OFFSET_SHIFT: u32 = 48;
/// TX frames must start at a multiple of this: in copy mode kernel 6.18 keeps a sent
/// frame's address in the skb's destructor argument with bit 0 as a tag and returns it in
/// the completion ring with that bit cleared (measured: 300333 came back as 300332).
pub const TX_ADDR_ALIGN: u64 = 2;
/// SO_BUSY_POLL's microseconds for a socket configured with busy polling.
pub const BUSY_POLL_USECS: i32 = 20;
/// SO_BUSY_POLL_BUDGET for a socket configured with busy polling.
pub const BUSY_POLL_BUDGET: i32 = 64;

// Socket options not in every libc's Linux constants.
const SO_PREFER_BUSY_POLL: libc::c_int = 69;
const SO_BUSY_POLL_BUDGET: libc::c_int = 70;

/// How the socket is bound: zero-copy (the driver DMAs into the UMEM) or copy (the kernel
/// copies each frame in and out; veth and drivers without AF_XDP support).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindMode {
    Copy,
    ZeroCopy,
}

/// How to bind a socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XskConfig {
    /// Try XDP_ZEROCOPY before XDP_COPY (off: copy mode only).
    pub try_zero_copy: bool,
    /// Set SO_PREFER_BUSY_POLL, SO_BUSY_POLL and SO_BUSY_POLL_BUDGET, for a caller that
    /// spins on [`FrameIo::recv`] rather than [`FrameIo::wait`]ing (which one is the
    /// protocol's choice; this only tells drivers with NAPI busy polling to let it).
    pub busy_poll: bool,
}

impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            try_zero_copy: true,
            busy_poll: false,
        }
    }
}

/// The kernel's XDP_STATISTICS for one socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames dropped for reasons other than an invalid descriptor (e.g. no fill entry).
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    /// Frames dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times a frame found the fill ring empty.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the kernel found the TX ring empty when asked to send.
    pub tx_ring_empty_descs: u64,
}

/// One mapped ring. `P` is the entry type: u64 addresses (fill, completion) or xdp_desc
/// (RX, TX).
struct Ring<P> {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut P,
    size: u32,
    /// Our copy of the index we own, and our last view of the other side's.
    cached_prod: u32,
    cached_cons: u32,
    map: *mut libc::c_void,
    map_len: usize,
}

impl<P: Copy> Ring<P> {
    /// Map ring `pgoff` of socket `fd` with the offsets the kernel reported.
    fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
        what: &'static str,
    ) -> Result<Ring<P>, XskError> {
        let map_len = off.desc as usize + size as usize * std::mem::size_of::<P>();
        // SAFETY: maps the kernel's ring memory for this socket; the length is what the
        // kernel's layout (desc offset + entries) needs and the result is checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(XskError::sys(what, io::Error::last_os_error()));
        }
        let at = |o: u64| (map as usize + o as usize) as *mut u8;
        let mut ring = Ring {
            producer: at(off.producer) as *const AtomicU32,
            consumer: at(off.consumer) as *const AtomicU32,
            flags: at(off.flags) as *const AtomicU32,
            descs: at(off.desc) as *mut P,
            size,
            cached_prod: 0,
            cached_cons: 0,
            map,
            map_len,
        };
        ring.cached_prod = ring.prod().load(Ordering::Relaxed);
        ring.cached_cons = ring.cons().load(Ordering::Relaxed);
        Ok(ring)
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: the index is a u32 in the mapping, 4-byte aligned (the kernel's layout),
        // valid while the ring is mapped (as long as `self`); the kernel accesses it
        // atomically too.
        unsafe { &*self.producer }
    }

    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as in `prod`.
        unsafe { &*self.consumer }
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: as in `prod`.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    fn slot(&self, idx: u32) -> *mut P {
        // SAFETY: `idx & (size - 1)` < size, within the descriptor array of the mapping.
        unsafe { self.descs.add((idx & (self.size - 1)) as usize) }
    }

    // -- producer side (fill, TX) --

    /// Free slots, refreshing our view of the consumer only when the cached one does
    /// not show `want` free.
    fn free(&mut self, want: u32) -> u32 {
        let free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free >= want {
            return free;
        }
        // Acquire: the kernel's reads of the entries it consumed happen before we reuse
        // their slots.
        self.cached_cons = self.cons().load(Ordering::Acquire);
        self.size - self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Write up to `items.len()` entries and publish them; returns how many.
    fn produce(&mut self, items: impl ExactSizeIterator<Item = P>) -> usize {
        let n = self.free(items.len() as u32).min(items.len() as u32);
        for (i, item) in items.take(n as usize).enumerate() {
            // SAFETY: the slot is free (the consumer is past it) and in the mapping.
            unsafe {
                self.slot(self.cached_prod.wrapping_add(i as u32))
                    .write(item)
            };
        }
        self.cached_prod = self.cached_prod.wrapping_add(n);
        // Release: the entries written above are visible before the kernel sees the index.
        self.prod().store(self.cached_prod, Ordering::Release);
        n as usize
    }

    // -- consumer side (RX, completion) --

    fn available(&mut self, want: u32) -> u32 {
        let avail = self.cached_prod.wrapping_sub(self.cached_cons);
        if avail >= want {
            return avail;
        }
        // Acquire: the kernel's writes of the entries (and of the frames they describe)
        // happen before we read them.
        self.cached_prod = self.prod().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }

    /// Read up to `max` entries into `f` and release their slots; returns how many.
    fn consume(&mut self, max: usize, mut f: impl FnMut(P)) -> usize {
        let n = self
            .available(max.min(u32::MAX as usize) as u32)
            .min(max as u32);
        for i in 0..n {
            // SAFETY: the kernel published the slot (Acquire above) and it is in the mapping.
            f(unsafe { self.slot(self.cached_cons.wrapping_add(i)).read() });
        }
        self.cached_cons = self.cached_cons.wrapping_add(n);
        // Release: our reads of the entries happen before the kernel reuses the slots.
        self.cons().store(self.cached_cons, Ordering::Release);
        n as usize
    }
}

impl<P> Drop for Ring<P> {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Ring::map` with this length and is only
        // unmapped here.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// An AF_XDP socket bound to one queue of one interface, its frames landing in and
/// leaving from a [`Region`] (the UMEM), which several sockets may share.
pub struct XskSocket {
    // Rings before the descriptor: they are unmapped before the socket closes.
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fd: OwnedFd,
    region: Arc<Region>,
    mode: BindMode,
    ifindex: u32,
    queue: u32,
    /// Addresses of frames refused at transmit (not TX_ADDR_ALIGN-aligned), handed back
    /// by the next `completions` as the kernel hands back a sent frame's.
    refused: std::collections::VecDeque<u64>,
    tx_refused: u64,
}

// SAFETY: the ring pointers point into mappings owned by this value; the kernel is the
// only other party and the rings' atomics order access with it. Moving the socket to
// another thread moves all of that along.
unsafe impl Send for XskSocket {}
// SAFETY: through `&XskSocket` the rings are only read (fill_free: atomic loads and our
// own cached index); every ring mutation takes `&mut self`. The rest is the descriptor
// and plain values.
unsafe impl Sync for XskSocket {}

fn setsockopt<T>(fd: RawFd, level: i32, name: i32, val: &T) -> io::Result<()> {
    // SAFETY: `val` is a valid T for the length given.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Read socket option `name` into a T. Only for libc's plain-data option structs (all
/// integers), for which all-zero bytes are a valid value.
fn getsockopt<T: Copy>(fd: RawFd, level: i32, name: i32) -> io::Result<T> {
    // SAFETY: T is one of libc's plain-data option structs (see above): zero is valid.
    let mut val: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `val`.
    let rc = unsafe { libc::getsockopt(fd, level, name, (&mut val as *mut T).cast(), &mut len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(val)
}

/// The index of interface `ifname` in the calling thread's network namespace.
pub fn ifindex(ifname: &str) -> Result<u32, XskError> {
    let c = CString::new(ifname).map_err(|_| XskError::NoInterface {
        name: ifname.to_string(),
    })?;
    // SAFETY: `c` is a valid C string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(XskError::NoInterface {
            name: ifname.to_string(),
        });
    }
    Ok(idx)
}

/// The MAC address of interface `ifname` in the calling thread's network namespace.
pub fn mac_address(ifname: &str) -> Result<[u8; 6], XskError> {
    let name = ifname.as_bytes();
    // SAFETY: an ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() || name.contains(&0) {
        return Err(XskError::NoInterface {
            name: ifname.to_string(),
        });
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    // SAFETY: a plain datagram socket, checked and owned right away.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(XskError::sys("socket", io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: SIOCGIFHWADDR reads the name from and writes the address into `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } != 0 {
        return Err(XskError::NoInterface {
            name: ifname.to_string(),
        });
    }
    // SAFETY: SIOCGIFHWADDR filled the sockaddr member of the union.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(mac)
}

impl XskSocket {
    /// A socket on queue `queue` of `ifname` (in the calling thread's network namespace)
    /// that registers `region` as its UMEM. Its frames reach it once it is registered with
    /// the interface's [`crate::XdpProgram`].
    pub fn new(
        region: Arc<Region>,
        ifname: &str,
        queue: u32,
        config: XskConfig,
    ) -> Result<XskSocket, XskError> {
        let ifindex = ifindex(ifname)?;
        let fd = open_socket()?;
        let reg = libc::xdp_umem_reg {
            addr: region.as_ptr() as u64,
            len: region.len() as u64,
            chunk_size: UMEM_CHUNK_SIZE,
            headroom: 0,
            flags: libc::XDP_UMEM_UNALIGNED_CHUNK_FLAG,
            tx_metadata_len: 0,
        };
        setsockopt(fd.as_raw_fd(), libc::SOL_XDP, libc::XDP_UMEM_REG, &reg).map_err(|e| match e
            .raw_os_error()
        {
            Some(libc::ENOBUFS) => XskError::MemlockLimit { len: region.len() },
            Some(libc::EFAULT) => XskError::UmemPin {
                len: region.len(),
                source: e,
            },
            _ => XskError::sys("XDP_UMEM_REG", e),
        })?;
        let mut s = Self::finish(fd, region, ifindex, queue, config, None)?;
        s.bind(config)?;
        Ok(s)
    }

    /// A socket on queue `queue` of `ifname` that shares `first`'s UMEM (XDP_SHARED_UMEM)
    /// with fill and completion rings of its own: commands and data on two queues, the
    /// server's data memory one volume. The queue (or interface) must differ from
    /// `first`'s; the bind mode is `first`'s.
    pub fn shared(
        first: &XskSocket,
        ifname: &str,
        queue: u32,
        config: XskConfig,
    ) -> Result<XskSocket, XskError> {
        let ifindex = ifindex(ifname)?;
        if ifindex == first.ifindex && queue == first.queue {
            return Err(XskError::SameQueue { queue });
        }
        let fd = open_socket()?;
        Self::finish(
            fd,
            first.region.clone(),
            ifindex,
            queue,
            config,
            Some(first.fd.as_raw_fd()),
        )
    }

    fn finish(
        fd: OwnedFd,
        region: Arc<Region>,
        ifindex: u32,
        queue: u32,
        config: XskConfig,
        shared_with: Option<RawFd>,
    ) -> Result<XskSocket, XskError> {
        let raw = fd.as_raw_fd();
        let ring_opt = |name, size: u32, what| {
            setsockopt(raw, libc::SOL_XDP, name, &size).map_err(|e| XskError::sys(what, e))
        };
        ring_opt(
            libc::XDP_UMEM_FILL_RING,
            FILL_RING_SIZE,
            "XDP_UMEM_FILL_RING",
        )?;
        ring_opt(
            libc::XDP_UMEM_COMPLETION_RING,
            COMPLETION_RING_SIZE,
            "XDP_UMEM_COMPLETION_RING",
        )?;
        ring_opt(libc::XDP_RX_RING, RX_RING_SIZE, "XDP_RX_RING")?;
        ring_opt(libc::XDP_TX_RING, TX_RING_SIZE, "XDP_TX_RING")?;
        if config.busy_poll {
            let opt = |name, val: i32, what| {
                setsockopt(raw, libc::SOL_SOCKET, name, &val).map_err(|e| XskError::sys(what, e))
            };
            opt(SO_PREFER_BUSY_POLL, 1, "SO_PREFER_BUSY_POLL")?;
            opt(libc::SO_BUSY_POLL, BUSY_POLL_USECS, "SO_BUSY_POLL")?;
            opt(SO_BUSY_POLL_BUDGET, BUSY_POLL_BUDGET, "SO_BUSY_POLL_BUDGET")?;
        }
        let off: libc::xdp_mmap_offsets = getsockopt(raw, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS)
            .map_err(|e| XskError::sys("XDP_MMAP_OFFSETS", e))?;
        let fill = Ring::map(
            raw,
            &off.fr,
            FILL_RING_SIZE,
            libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t,
            "mmap fill ring",
        )?;
        let comp = Ring::map(
            raw,
            &off.cr,
            COMPLETION_RING_SIZE,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t,
            "mmap completion ring",
        )?;
        let rx = Ring::map(
            raw,
            &off.rx,
            RX_RING_SIZE,
            libc::XDP_PGOFF_RX_RING,
            "mmap RX ring",
        )?;
        let tx = Ring::map(
            raw,
            &off.tx,
            TX_RING_SIZE,
            libc::XDP_PGOFF_TX_RING,
            "mmap TX ring",
        )?;
        let mut s = XskSocket {
            fill,
            comp,
            rx,
            tx,
            fd,
            region,
            mode: BindMode::Copy,
            ifindex,
            queue,
            refused: std::collections::VecDeque::new(),
            tx_refused: 0,
        };
        if let Some(owner) = shared_with {
            let addr = s.sockaddr(libc::XDP_SHARED_UMEM, owner as u32);
            s.bind_to(&addr).map_err(|e| XskError::Bind {
                ifindex,
                queue,
                source: e,
            })?;
            s.mode = s.query_mode()?;
        }
        Ok(s)
    }

    fn sockaddr(&self, flags: u16, shared_fd: u32) -> libc::sockaddr_xdp {
        libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: self.ifindex,
            sxdp_queue_id: self.queue,
            sxdp_shared_umem_fd: shared_fd,
        }
    }

    fn bind_to(&self, addr: &libc::sockaddr_xdp) -> io::Result<()> {
        // SAFETY: `addr` is a valid sockaddr_xdp of the length given.
        let rc = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (addr as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Bind zero-copy if allowed and possible, else copy, both with need_wakeup.
    fn bind(&mut self, config: XskConfig) -> Result<(), XskError> {
        if config.try_zero_copy {
            let zc = self.sockaddr(libc::XDP_ZEROCOPY | libc::XDP_USE_NEED_WAKEUP, 0);
            if self.bind_to(&zc).is_ok() {
                self.mode = self.query_mode()?;
                return Ok(());
            }
        }
        let copy = self.sockaddr(libc::XDP_COPY | libc::XDP_USE_NEED_WAKEUP, 0);
        self.bind_to(&copy).map_err(|e| XskError::Bind {
            ifindex: self.ifindex,
            queue: self.queue,
            source: e,
        })?;
        self.mode = self.query_mode()?;
        Ok(())
    }

    fn query_mode(&self) -> Result<BindMode, XskError> {
        let o: libc::xdp_options =
            getsockopt(self.fd.as_raw_fd(), libc::SOL_XDP, libc::XDP_OPTIONS)
                .map_err(|e| XskError::sys("XDP_OPTIONS", e))?;
        Ok(if o.flags & libc::XDP_OPTIONS_ZEROCOPY != 0 {
            BindMode::ZeroCopy
        } else {
            BindMode::Copy
        })
    }

    /// Whether frames are copied in and out or DMAed in place.
    pub fn mode(&self) -> BindMode {
        self.mode
    }

    /// The queue the socket is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// The index of the interface the socket is bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The shared UMEM (for a second socket's [`XskSocket::shared`] or the caller's own
    /// bookkeeping).
    pub fn region_arc(&self) -> &Arc<Region> {
        &self.region
    }

    /// The kernel's counters for this socket.
    pub fn statistics(&self) -> Result<XskStats, XskError> {
        let s: libc::xdp_statistics =
            getsockopt(self.fd.as_raw_fd(), libc::SOL_XDP, libc::XDP_STATISTICS)
                .map_err(|e| XskError::sys("XDP_STATISTICS", e))?;
        Ok(XskStats {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: s.tx_ring_empty_descs,
        })
    }

    /// Queue frames for sending like [`FrameIo::transmit`], but refuse the whole batch
    /// with [`XskError::UnalignedTx`] (nothing queued) if a frame's address is not a
    /// multiple of [`TX_ADDR_ALIGN`].
    pub fn try_transmit(&mut self, frames: &[Desc]) -> Result<usize, XskError> {
        if let Some(f) = frames.iter().find(|f| f.addr % TX_ADDR_ALIGN != 0) {
            return Err(XskError::UnalignedTx {
                addr: f.addr,
                align: TX_ADDR_ALIGN,
            });
        }
        Ok(FrameIo::transmit(self, frames))
    }

    /// Frames [`FrameIo::transmit`] refused because their address was not a multiple
    /// of [`TX_ADDR_ALIGN`].
    pub fn tx_refused(&self) -> u64 {
        self.tx_refused
    }

    /// Tell the kernel to send what the TX ring holds (copy mode sends in this call).
    fn kick_tx(&self) {
        // SAFETY: an empty sendto on our socket; no buffers are passed.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if rc < 0 {
            // EAGAIN/EBUSY/ENOBUFS: the kernel is still sending or out of skbs; the frames
            // stay in the ring and go with the next kick. ENETDOWN: the link is down, the
            // protocol's timeouts see it. Nothing else is expected.
            let e = io::Error::last_os_error();
            debug_assert!(
                matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN | libc::ENXIO)
                ),
                "AF_XDP TX kick: {e}"
            );
        }
    }

    /// Hand the kernel a chance to refill when the fill ring asks for it (zero-copy drivers).
    fn kick_rx(&self) {
        // SAFETY: an empty, non-blocking recvfrom on our socket; no buffers are passed.
        unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    }
}

impl AsFd for XskSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for XskSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl std::fmt::Debug for XskSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskSocket")
            .field("fd", &self.fd)
            .field("ifindex", &self.ifindex)
            .field("queue", &self.queue)
            .field("mode", &self.mode)
            .finish()
    }
}

fn open_socket() -> Result<OwnedFd, XskError> {
    // SAFETY: socket(2) with constant arguments; the result is checked and owned at once.
    let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => XskError::Permission { source: e },
            Some(libc::EAFNOSUPPORT) => XskError::NoAfXdp,
            _ => XskError::sys("socket(AF_XDP)", e),
        });
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

impl FrameIo for XskSocket {
    fn region(&self) -> &Region {
        &self.region
    }

    fn fill(&mut self, addrs: &[u64]) -> usize {
        self.fill.produce(addrs.iter().copied())
    }

    fn fill_free(&self) -> usize {
        // Read-only view: the consumer index may have moved on since the last refresh.
        // Acquire as in Ring::free.
        let cons = self.fill.cons().load(Ordering::Acquire);
        (self.fill.size - self.fill.cached_prod.wrapping_sub(cons)) as usize
    }

    fn recv(&mut self, out: &mut Vec<Desc>, max: usize) -> usize {
        let n = self.rx.consume(max, |d| {
            let base = d.addr & ((1u64 << UNALIGNED_OFFSET_SHIFT) - 1);
            let offset = d.addr >> UNALIGNED_OFFSET_SHIFT;
            out.push(Desc {
                addr: base + offset,
                len: d.len,
            });
        });
        if n == 0 && self.fill.needs_wakeup() {
            self.kick_rx();
        }
        n
    }

    /// Frames must start at a multiple of [`TX_ADDR_ALIGN`] (else their completion would
    /// come back with another address): one that does not is refused, in release builds
    /// too: never sent, counted ([`XskSocket::tx_refused`]) and its address handed back
    /// by the next [`FrameIo::completions`], as an invalid descriptor is (it counts as
    /// taken). [`XskSocket::try_transmit`] refuses such a batch with an error instead.
    fn transmit(&mut self, frames: &[Desc]) -> usize {
        let mut n = 0;
        let mut queued = 0;
        while n < frames.len() {
            let run = frames[n..]
                .iter()
                .take_while(|f| f.addr % TX_ADDR_ALIGN == 0)
                .count();
            if run == 0 {
                self.tx_refused += 1;
                self.refused.push_back(frames[n].addr);
                n += 1;
                continue;
            }
            let q = self
                .tx
                .produce(frames[n..n + run].iter().map(|f| libc::xdp_desc {
                    addr: f.addr,
                    len: f.len,
                    options: 0,
                }));
            n += q;
            queued += q;
            if q < run {
                break;
            }
        }
        if queued > 0 && self.tx.needs_wakeup() {
            self.kick_tx();
            // Copy mode takes at most 32 frames per kick: kick again while the kernel
            // takes more, so no frame waits in the ring for the caller's next poll (a
            // caller asleep on its sockets polls again only after its wait slice: a
            // 64 KiB read, 45 frames, took 1.5 ms against 0.14 ms on TCP).
            for _ in 0..MAX_KICKS_PER_TRANSMIT {
                let taken = self.tx.cons().load(Ordering::Acquire);
                if taken == self.tx.cached_prod || !self.tx.needs_wakeup() {
                    break;
                }
                self.kick_tx();
                if self.tx.cons().load(Ordering::Acquire) == taken {
                    // No progress (the kernel is busy or out of skbs): the next poll's
                    // completions kick again.
                    break;
                }
            }
        }
        n
    }

    fn completions(&mut self, out: &mut Vec<u64>, max: usize) -> usize {
        let k = max.min(self.refused.len());
        out.extend(self.refused.drain(..k));
        if k == max {
            return k;
        }
        let n = k + self.comp.consume(max - k, |a| out.push(a));
        // A TX ring that still holds frames the kernel has not taken (it stopped at
        // EAGAIN/EBUSY) is kicked again, so a caller waiting for completions progresses.
        if n == 0
            && self.tx.cached_prod != self.tx.cons().load(Ordering::Acquire)
            && self.tx.needs_wakeup()
        {
            self.kick_tx();
        }
        n
    }

    fn wait(&mut self, timeout: Duration) -> io::Result<bool> {
        if self.rx.available(1) > 0 {
            return Ok(true);
        }
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Rounded up: a timeout under a millisecond still waits, rather than spinning.
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(e);
        }
        Ok(self.rx.available(1) > 0)
    }
}

/// Tries of a bind whose queue is still busy (10 ms apart): the kernel releases a closed
/// socket's buffer pool from a work queue, so a process restarted on the same queue can
/// find it busy (EBUSY) for a moment.
pub const BIND_TRIES: u32 = 200;

/// Make a socket with `make`, trying again (up to [`BIND_TRIES`] times, 10 ms apart)
/// while its queue is still busy, or while its UMEM does not fit the locked-memory
/// limit: the kernel uncharges a closed socket's UMEM in the same deferred work, so a
/// socket made again on the same memory right after the old one closed is counted
/// twice for a moment (review 29: ENOBUFS 30-50 µs after the close under an 8 MiB
/// limit, which it fits once). Any other outcome is returned at once.
pub fn bind_retrying(
    mut make: impl FnMut() -> Result<XskSocket, XskError>,
) -> Result<XskSocket, XskError> {
    for _ in 1..BIND_TRIES {
        match make() {
            Err(XskError::Bind { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(XskError::MemlockLimit { .. }) => std::thread::sleep(Duration::from_millis(10)),
            other => return other,
        }
    }
    make()
}
