//! The application's side: a small, stable Rust API over the control socket and the
//! rings, which the C ABI wraps.
//!
//! ```no_run
//! use zcfs_samehost::client::{Client, Options};
//! let mut c = Client::connect("/run/zcfs/vol.samehost.sock")?;
//! let buf = c.register_buffer(1 << 20)?;
//! let f = c.open("/data/x", libc::O_RDWR | libc::O_CREAT, 0o644)?;
//! c.buffer_mut(buf)?[..5].copy_from_slice(b"hello");
//! c.write(f.handle, 0, buf, 0, 5)?;          // shared buffer: one copy, by the server
//! assert_eq!(c.read(f.handle, 0, buf, 4096, 5)?, 5);
//! # Ok::<(), zcfs_samehost::client::Error>(())
//! ```
//!
//! Synchronous calls (`read`, `write`, `read_extents`, ...) submit one entry and wait
//! for its completion. For batches, build [`Sqe`]s and use [`Client::submit`] and
//! [`Client::wait`]; a buffer range named by an entry in flight must not be touched
//! until its completion arrives (as with io_uring).
//!
//! Every error has an errno ([`Error::errno`]) for the C layer.

use crate::proto::{self, MapGeometry, ProtoError, Reply, Request, PROTOCOL_VERSION};
use crate::ring::{self, op, Cqe, ExtentDesc, Mapping, Placement, Rings, Sqe};
use crate::server::StatsSnapshot;
use rustix::event::{PollFd, PollFlags};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{MemfdFlags, SealFlags};
use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::ring::{DEFAULT_RING_ENTRIES, NO_NEW_SIZE};

/// Bit 63 of `user_data` marks the library's own synchronous calls ([`Client::call`]);
/// [`Client::submit`] refuses entries that carry it.
pub const CALL_USER_DATA: u64 = 1 << 63;
/// How long a waiting application polls the completion ring before it sleeps on its
/// eventfd (see docs/samehost.md, "Doorbell").
pub const DEFAULT_CLIENT_SPIN: Duration = Duration::from_micros(50);
/// The internal buffer direct-map calls use for descriptors, offsets and placements.
pub const SCRATCH_LEN: usize = 256 << 10;
/// Most extent descriptors one `read_extents` returns (what the scratch buffer holds).
pub const MAX_EXTENTS_PER_CALL: usize = SCRATCH_LEN / ring::EXTENT_DESC_SIZE;
/// Most pages one `reserve` takes (what the scratch buffer holds offsets for).
pub const MAX_RESERVE_PER_CALL: usize = SCRATCH_LEN / 8;
/// Most placements one [`Client::commit`] carries: each names its own reservation, and
/// the server lets a connection hold at most `MAX_RESERVATIONS` (1024) at once and take
/// at most `MAX_PLACEMENTS` (4096) in one COMMIT.
pub const MAX_PLACEMENTS_PER_COMMIT: usize = crate::server::MAX_RESERVATIONS;
const _: () = assert!(
    MAX_PLACEMENTS_PER_COMMIT as u64 <= crate::server::MAX_PLACEMENTS
        && MAX_PLACEMENTS_PER_COMMIT * ring::PLACEMENT_SIZE <= SCRATCH_LEN
);

/// A failed call. [`Error::errno`] gives the errno the C layer returns (negated).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server refused a control request.
    #[error("{message} ({})", zcfs_types::errno_name(*.errno))]
    Server { errno: i32, message: String },
    /// A ring operation completed with an error.
    #[error("request failed: {}", zcfs_types::errno_name(*.0))]
    Errno(i32),
    /// No room in the submission ring (EAGAIN): wait for completions first.
    #[error("the submission ring is full")]
    RingFull,
    /// The server closed the connection (it shut down, or found the rings corrupt).
    #[error("the server closed the connection")]
    Disconnected,
    /// A direct-map call before `direct_map`, or by an untrusted application (EPERM).
    #[error("no direct map: call direct_map first (trusted applications only)")]
    NoDirectMap,
    /// A call's arguments do not fit (EINVAL).
    #[error("{0}")]
    Invalid(String),
    #[error("protocol: {0}")]
    Protocol(#[from] ProtoError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The errno of this error (positive).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Server { errno, .. } | Error::Errno(errno) => *errno,
            Error::RingFull => libc::EAGAIN,
            Error::Disconnected => libc::ECONNRESET,
            Error::NoDirectMap => libc::EPERM,
            Error::Invalid(_) => libc::EINVAL,
            Error::Protocol(_) => libc::EPROTO,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

impl From<rustix::io::Errno> for Error {
    fn from(e: rustix::io::Errno) -> Error {
        Error::Io(e.into())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
/// A registered buffer.
pub type BufferId = u32;
/// An open file (valid on its connection only).
pub type Handle = u32;

/// How to connect.
#[derive(Debug, Clone)]
pub struct Options {
    /// Entries of each ring (a power of two, 2..=4096).
    pub entries: u32,
    /// Ask whether the direct map will be granted (see [`Client::trusted`]).
    pub want_direct: bool,
    /// See [`DEFAULT_CLIENT_SPIN`].
    pub spin: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            entries: DEFAULT_RING_ENTRIES,
            want_direct: true,
            spin: DEFAULT_CLIENT_SPIN,
        }
    }
}

/// An opened file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct File {
    pub handle: Handle,
    /// Its size when opened.
    pub size: u64,
    /// Its counter in the direct map's change counters ([`DirectMap::change_count`]).
    pub change_slot: u32,
}

/// Bytes of a file one kept lease of [`Client::read_mapped`] covers (aligned to it).
pub const MAPPED_CHUNK: u64 = 1 << 20;
/// Most chunks [`Client::read_mapped`] keeps leased: 256 MiB, the server's bound on a
/// connection's leased blocks (`MAX_LEASED_BLOCKS`). A lease asked for when the server's
/// bound is reached gives kept chunks back first, least recently read first.
pub const MAPPED_CHUNKS_MAX: usize = 256;
/// How long mapped reads trust the server that leased their kept chunks to be alive
/// without looking (its control socket hung up: a server that dies cannot raise the
/// counters, and another opening of the image changes files unseen). A stale read
/// would need another server to open the image and change a file within this time of
/// the first one's death.
pub const MAPPED_ALIVE_CHECK: Duration = Duration::from_millis(1);
/// Attempts of a read over several chunks to find them all of one state of the file
/// while it changes; after them it leases its range in one call.
pub const MAPPED_ATTEMPTS: usize = 4;

/// A chunk kept leased for mapped reads.
struct MappedChunk {
    lease: u64,
    extents: Vec<ExtentDesc>,
    /// The file's change counter read before the lease was asked for: while the counter
    /// still says this, the extents are the file's.
    count: u64,
    /// The last read that used it (for eviction; a chunk of the read under way is
    /// never given back).
    used: u64,
}

/// A piece of a mapped read, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// The file's bytes in place in the image.
    Data(&'a [u8]),
    /// A hole of this many bytes (reads as zeros).
    Hole(u64),
}

impl Piece<'_> {
    pub fn len(&self) -> u64 {
        match self {
            Piece::Data(b) => b.len() as u64,
            Piece::Hole(n) => *n,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Leased extents of a file (see `read_extents`); release with [`Client::release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub id: u64,
    pub extents: Vec<ExtentDesc>,
    /// Bytes covered (short of the range asked at the end of the file).
    pub bytes: u64,
}

/// Fresh blocks this connection holds until it commits them into files
/// ([`Client::commit`]) or gives them back ([`Client::release_reservation`], or by
/// dropping it): the only way to write them is its [`Window`], which borrows it.
///
/// It is a token, not plain data: it cannot be made or cloned outside this module, and
/// commit and release consume it, so once its blocks are a file's (or free again) no
/// window of it is left to write them. It also keeps the connection open: a server
/// gives a connection's reservations back to the allocator when the connection closes,
/// so a reservation outliving its [`Client`] holds the socket until it is dropped.
///
/// A write through a window after its reservation is committed does not compile (the
/// commit moves the reservation the window borrows):
///
/// ```compile_fail,E0505
/// # use zcfs_samehost::client::{Client, Place, NO_NEW_SIZE};
/// # fn f(c: &mut Client, handle: u32) -> zcfs_samehost::client::Result<()> {
/// let mut r = c.reserve(1)?;
/// let mut w = r.window();
/// w.page_mut(0).fill(b'a');
/// c.commit(vec![Place { handle, file_offset: 0, reservation: r, new_size: NO_NEW_SIZE }])?;
/// w.page_mut(0).fill(b'Z'); // the file's block now: refused by the borrow checker
/// # Ok(()) }
/// ```
///
/// The same without the late write compiles:
///
/// ```no_run
/// # use zcfs_samehost::client::{Client, Place, NO_NEW_SIZE};
/// # fn f(c: &mut Client, handle: u32) -> zcfs_samehost::client::Result<()> {
/// let mut r = c.reserve(1)?;
/// let mut w = r.window();
/// w.page_mut(0).fill(b'a');
/// c.commit(vec![Place { handle, file_offset: 0, reservation: r, new_size: NO_NEW_SIZE }])?;
/// # Ok(()) }
/// ```
pub struct Reservation {
    id: u64,
    /// Byte offset of each page in the image, checked at `reserve` to be whole pages
    /// inside the data area and inside `map`.
    offsets: Vec<u64>,
    /// The client's writable mapping of the image.
    map: Arc<Mapping>,
    /// The connection that holds the blocks (kept open while this lives).
    conn: Arc<Conn>,
    /// False once committed or released (then `Drop` has nothing to give back).
    held: bool,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("id", &self.id)
            .field("offsets", &self.offsets)
            .finish()
    }
}

impl Reservation {
    /// The server's id of the reservation (per connection).
    pub fn id(&self) -> u64 {
        self.id
    }
    pub fn pages(&self) -> usize {
        self.offsets.len()
    }
    /// Byte offset of each page in the image, in order.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }
    /// The writable pages: views into the client's one writable mapping of the image
    /// (made once, at `direct_map`), so a window costs no mmap, no munmap and no page
    /// faults on blocks this process has written before. It borrows the reservation,
    /// so it cannot outlive it, and no other view of these pages exists meanwhile.
    pub fn window(&mut self) -> Window<'_> {
        Window { r: self }
    }
    /// Committed or released: nothing left to give back. Returns the id.
    fn consumed(mut self) -> u64 {
        self.held = false;
        self.id
    }
    /// Tests: put the pages in reverse order (still this reservation's own blocks, so
    /// the window's guarantee holds; it shows each page is the one its offset names).
    #[doc(hidden)]
    pub fn reverse_pages_for_tests(&mut self) {
        self.offsets.reverse();
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.held {
            // Given back by the client's next `reserve` or `release_reservation` (or
            // by the server when the connection closes).
            if let Ok(mut q) = self.conn.dropped.lock() {
                q.push(self.id);
            }
        }
    }
}

/// The writable pages of a [`Reservation`], borrowed from it (see
/// [`Reservation::window`]).
pub struct Window<'r> {
    r: &'r mut Reservation,
}

impl Window<'_> {
    pub fn pages(&self) -> usize {
        self.r.offsets.len()
    }
    /// Page `i` of the reservation, to fill (panics when `i` is not below `pages()`, as
    /// slice indexing does).
    pub fn page_mut(&mut self, i: usize) -> &mut [u8] {
        let o = self.r.offsets[i];
        // SAFETY: `reserve` checked the page inside the mapping, which the reservation
        // keeps alive (`map`). While the reservation exists the server holds the block
        // for this connection and neither writes it nor hands it out: only consuming
        // the reservation (commit, release), an `unsafe` raw entry, or closing the
        // connection, which the reservation keeps open, ends that (the server process
        // ending is outside this contract: docs/samehost.md). This window borrows the
        // reservation mutably and the returned slice borrows the window mutably, so
        // the view is unique in this process and ends before the reservation can be
        // consumed.
        unsafe { std::slice::from_raw_parts_mut(self.r.map.as_ptr().add(o as usize), 4096) }
    }
    /// Fill the pages in order from `data` (at most `pages * 4096` bytes); the rest of
    /// a partly filled last page is left as it is (zero).
    pub fn fill(&mut self, data: &[u8]) {
        for (i, chunk) in data.chunks(4096).enumerate() {
            self.page_mut(i)[..chunk.len()].copy_from_slice(chunk);
        }
    }
    /// Copy `data` into the window from byte `at` of the reservation (byte `at % 4096`
    /// of page `at / 4096` on), page after page whatever their order in the image.
    /// False, and nothing written, when it would go past the last page.
    pub fn write_at(&mut self, at: usize, data: &[u8]) -> bool {
        if at
            .checked_add(data.len())
            .is_none_or(|end| end > self.pages() * 4096)
        {
            return false;
        }
        let (mut page, mut within, mut rest) = (at / 4096, at % 4096, data);
        while !rest.is_empty() {
            let n = rest.len().min(4096 - within);
            self.page_mut(page)[within..within + n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            (page, within) = (page + 1, 0);
        }
        true
    }
    /// The window as one slice, when the reservation is one run of adjacent blocks.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        let first = *self.r.offsets.first()?;
        let contiguous = self
            .r
            .offsets
            .iter()
            .enumerate()
            .all(|(i, &o)| o == first + i as u64 * 4096);
        if !contiguous {
            return None;
        }
        // SAFETY: as in `page_mut`, for the whole run of adjacent reserved pages (each
        // checked inside the mapping at `reserve`).
        Some(unsafe {
            std::slice::from_raw_parts_mut(
                self.r.map.as_ptr().add(first as usize),
                self.r.offsets.len() * 4096,
            )
        })
    }
}

/// One placement of a [`Client::commit`]: the reservation's pages go to 4 KiB-aligned
/// `file_offset` of `handle`; the file grows to `new_size` (inside the last page) or,
/// with [`NO_NEW_SIZE`], to the end of the last page.
#[derive(Debug)]
pub struct Place {
    pub handle: Handle,
    pub file_offset: u64,
    pub reservation: Reservation,
    pub new_size: u64,
}

/// Whether pages `offsets` are whole pages inside the data area of `g` and inside a
/// mapping of `map_len` bytes (what a window's views need).
fn pages_inside(g: &MapGeometry, map_len: usize, offsets: &[u64]) -> bool {
    offsets.iter().all(|&o| {
        o.is_multiple_of(4096)
            && o >= g.data_start
            && o.checked_add(4096).is_some_and(|e| e <= g.data_end)
            && o.checked_add(4096).is_some_and(|e| e <= map_len as u64)
    })
}

/// Bytes of the writable mapping the window prefault thread populates per step; the
/// mapping is unmapped at most one step after the client lets go of it.
pub const WINDOW_PREFAULT_STEP: usize = 1 << 20;

/// Fault the writable mapping's pages in over the data area from a background thread
/// that runs only when a CPU is idle (a store fault per page, no address-space lock held
/// between pages: `Mapping::populate_writable`), so that filling a reservation's window
/// stores into mapped pages: a page fault per 4 KiB page held a checkpoint's fill to
/// ~2.2 GB/s here, against ~11 GB/s into mapped pages (docs/samehost.md, "The window's
/// page tables"). Only for an image in tmpfs with storage for every byte
/// (`populating_is_free`): an image with holes would get memory for each, one on disk
/// would be written back whole. The thread holds the mapping only during a step and
/// ends when the mapping is gone.
fn prefault_window(map: std::sync::Weak<Mapping>, start: u64, end: u64) {
    let page = rustix::param::page_size() as u64;
    let (start, end) = (start.next_multiple_of(page), end - end % page);
    let spawned = std::thread::Builder::new()
        .name("zcfs-window-prefault".into())
        .spawn(move || {
            zcfs_pmem::run_this_thread_when_idle();
            let mut at = start;
            while at < end {
                let Some(m) = map.upgrade() else { return };
                let n = (WINDOW_PREFAULT_STEP as u64).min(end - at);
                if m.populate_writable(at as usize, n as usize).is_err() {
                    return; // Not a range of the mapping: nothing to do.
                }
                at += n;
            }
        });
    if let Err(e) = spawned {
        tracing::debug!(err = %e, "no window prefault thread");
    }
}

/// The image, mapped read-only, and its read-write descriptor.
pub struct DirectMap {
    map: Mapping,
    /// The change counters, read-only (`geometry.change_slots` of them).
    changes: Mapping,
    /// The image mapped writable, shared by every window (its data area populated in
    /// the background on a fully allocated image, else faulted in on first use; pages
    /// stay mapped).
    rw_map: Arc<Mapping>,
    /// Whether faulting the image in costs page tables alone (`Client::prefault_window`).
    populating_is_free: bool,
    pub geometry: MapGeometry,
}

impl DirectMap {
    /// Where the writable mapping of the image starts in this process (tests look its
    /// residency up in /proc/self/smaps).
    #[doc(hidden)]
    pub fn writable_base(&self) -> *const u8 {
        self.rw_map.as_ptr()
    }
    /// The change counter at `slot` ([`File::change_slot`]): it moves whenever a file
    /// of that slot changes. None for a slot the server does not have.
    pub fn change_count(&self, slot: u32) -> Option<u64> {
        (slot < self.geometry.change_slots).then(|| {
            self.changes
                .atomic_u64(slot as usize * 8)
                .load(Ordering::Acquire)
        })
    }

    /// The image's bytes at an extent (`None` for a hole or a range outside the image).
    pub fn bytes(&self, e: &ExtentDesc) -> Option<&[u8]> {
        if e.is_hole() {
            return None;
        }
        let p = self.map.range(e.image_offset, e.len)?;
        // SAFETY: inside the read-only mapping; leased blocks are not written while the
        // lease lasts (the application must not use the slice after releasing it).
        Some(unsafe { std::slice::from_raw_parts(p, e.len as usize) })
    }
}

struct Buffer {
    map: Mapping,
}

/// The control socket, shared by the client and its reservations (see
/// [`Reservation`]): the server keeps a connection's reservations while it is open.
struct Conn {
    sock: UnixStream,
    /// Ids of reservations dropped unused, to give back.
    dropped: Mutex<Vec<u64>>,
}

/// A connection to the same-host service.
pub struct Client {
    conn: Arc<Conn>,
    rings: Rings,
    sq_tail: u32,
    cq_head: u32,
    bell_in: OwnedFd,
    bell_out: OwnedFd,
    spin: Duration,
    trusted: bool,
    bufs: HashMap<BufferId, Buffer>,
    scratch: Option<BufferId>,
    direct: Option<DirectMap>,
    /// Change slots of the open files, by handle.
    slots: HashMap<Handle, u32>,
    /// Chunks kept leased for mapped reads, by handle and chunk index.
    mapped: HashMap<(Handle, u64), MappedChunk>,
    /// Reads through `mapped` so far (the chunks' `used`).
    mapped_reads: u64,
    /// When a mapped read last found the server alive (`MAPPED_ALIVE_CHECK`).
    alive_checked: Instant,
    /// A lease a mapped read took for its range alone (a file changing under it),
    /// given back by the next call that can.
    transient: Option<u64>,
    next_user_data: u64,
    /// Completions reaped while waiting for another.
    stash: Vec<Cqe>,
    /// Entries submitted and not yet reaped.
    in_flight: u32,
}

impl Client {
    /// Connect with the default [`Options`].
    pub fn connect(path: impl AsRef<Path>) -> Result<Client> {
        Client::connect_with(path, &Options::default())
    }

    pub fn connect_with(path: impl AsRef<Path>, o: &Options) -> Result<Client> {
        let sock = UnixStream::connect(path)?;
        let trusted = match call(
            &sock,
            &Request::Hello {
                version: PROTOCOL_VERSION,
                want_direct: o.want_direct,
            },
            &[],
        )? {
            (Reply::Hello { trusted, .. }, _) => trusted,
            (r, _) => return Err(unexpected(r)),
        };
        let (entries, size, mut fds) =
            match call(&sock, &Request::SetupRings { entries: o.entries }, &[])? {
                (Reply::Rings { entries, size }, fds) => (entries, size, fds),
                (r, _) => return Err(unexpected(r)),
            };
        let bell_out = fds.pop().expect("count checked");
        let bell_in = fds.pop().expect("count checked");
        let memfd = fds.pop().expect("count checked");
        if size as usize != ring::ring_size(entries) {
            return Err(Error::Protocol(ProtoError::Short));
        }
        let map = Mapping::map(memfd.as_fd(), 0, size as usize, true)?;
        let rings = Rings::new(map, entries).ok_or(Error::Protocol(ProtoError::Short))?;
        if !rings.header_ok() {
            return Err(Error::Invalid(
                "the rings' header is not what the server said".into(),
            ));
        }
        Ok(Client {
            conn: Arc::new(Conn {
                sock,
                dropped: Mutex::new(Vec::new()),
            }),
            rings,
            sq_tail: 0,
            cq_head: 0,
            bell_in,
            bell_out,
            spin: o.spin,
            trusted,
            bufs: HashMap::new(),
            scratch: None,
            direct: None,
            slots: HashMap::new(),
            mapped: HashMap::new(),
            mapped_reads: 0,
            alive_checked: Instant::now(),
            transient: None,
            next_user_data: CALL_USER_DATA,
            stash: Vec::new(),
            in_flight: 0,
        })
    }

    /// Whether the server will grant the direct map.
    pub fn trusted(&self) -> bool {
        self.trusted
    }

    /// Entries of each ring.
    pub fn entries(&self) -> u32 {
        self.rings.entries
    }

    /// Make a buffer of `len` bytes (a sealed memfd, mapped here and by the server).
    pub fn register_buffer(&mut self, len: usize) -> Result<BufferId> {
        let fd = rustix::fs::memfd_create(
            "zcfs-samehost-buffer",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW)?;
        self.register_fd(fd.as_fd(), len)
    }

    /// Register a memfd the application made (sealed against shrinking, at least
    /// `len` bytes).
    pub fn register_fd(&mut self, fd: rustix::fd::BorrowedFd<'_>, len: usize) -> Result<BufferId> {
        let map = Mapping::map(fd, 0, len, true)?;
        match call(
            &self.conn.sock,
            &Request::RegisterBuffer { len: len as u64 },
            &[fd],
        )? {
            (Reply::Buffer { id }, _) => {
                self.bufs.insert(id, Buffer { map });
                Ok(id)
            }
            (r, _) => Err(unexpected(r)),
        }
    }

    /// A registered buffer's bytes.
    pub fn buffer(&self, id: BufferId) -> Result<&[u8]> {
        let b = self
            .bufs
            .get(&id)
            .ok_or_else(|| Error::Invalid(format!("no buffer {id}")))?;
        // SAFETY: our mapping of the buffer, alive while `self` is; the server writes
        // it only for entries in flight, which the caller must not read (module docs).
        Ok(unsafe { std::slice::from_raw_parts(b.map.as_ptr(), b.map.len()) })
    }

    pub fn buffer_mut(&mut self, id: BufferId) -> Result<&mut [u8]> {
        let b = self
            .bufs
            .get(&id)
            .ok_or_else(|| Error::Invalid(format!("no buffer {id}")))?;
        // SAFETY: as in `buffer`; `&mut self` keeps the view unique here.
        Ok(unsafe { std::slice::from_raw_parts_mut(b.map.as_ptr(), b.map.len()) })
    }

    /// Raw pointer and length of a registered buffer (for the C layer).
    pub fn buffer_raw(&self, id: BufferId) -> Result<(*mut u8, usize)> {
        let b = self
            .bufs
            .get(&id)
            .ok_or_else(|| Error::Invalid(format!("no buffer {id}")))?;
        Ok((b.map.as_ptr(), b.map.len()))
    }

    /// Open (with O_CREAT, create) a regular file by its path in the volume, as this
    /// process's user. `mode` is taken as given (no umask).
    pub fn open(&mut self, path: impl AsRef<[u8]>, flags: i32, mode: u32) -> Result<File> {
        let req = Request::Open {
            path: path.as_ref().to_vec(),
            flags,
            mode,
        };
        match call(&self.conn.sock, &req, &[])? {
            (
                Reply::Opened {
                    handle,
                    size,
                    change_slot,
                },
                _,
            ) => {
                self.slots.insert(handle, change_slot);
                Ok(File {
                    handle,
                    size,
                    change_slot,
                })
            }
            (r, _) => Err(unexpected(r)),
        }
    }

    pub fn close(&mut self, handle: Handle) -> Result<()> {
        self.forget_mapped(Some(handle))?;
        self.slots.remove(&handle);
        match call(&self.conn.sock, &Request::Close { handle }, &[])? {
            (Reply::Done, _) => Ok(()),
            (r, _) => Err(unexpected(r)),
        }
    }

    /// The service's counters.
    pub fn stats(&mut self) -> Result<StatsSnapshot> {
        match call(&self.conn.sock, &Request::Stats, &[])? {
            (Reply::Stats { json }, _) => {
                serde_json::from_slice(&json).map_err(|e| Error::Invalid(format!("stats: {e}")))
            }
            (r, _) => Err(unexpected(r)),
        }
    }

    /// Put entries on the submission ring (all or none: [`Error::RingFull`]) and ring
    /// the server's doorbell if it sleeps. A `user_data` with the
    /// [`CALL_USER_DATA`] bit is refused (EINVAL): those name the library's own calls.
    /// So are COMMIT and RESERVATION_RELEASE (EINVAL): they end reservations, which
    /// only [`Client::commit`] and [`Client::release_reservation`] may do, as they
    /// consume the [`Reservation`] and so its window.
    pub fn submit(&mut self, sqes: &[Sqe]) -> Result<()> {
        if let Some(s) = sqes.iter().find(|s| ends_reservations(s.op)) {
            return Err(ends_reservations_error(s.op));
        }
        // SAFETY: no entry ends a reservation (checked above).
        unsafe { self.submit_unchecked(sqes) }
    }

    /// [`Client::submit`] without the refusal of COMMIT and RESERVATION_RELEASE (tests
    /// of the server's handling of hostile entries).
    ///
    /// # Safety
    /// An entry that commits or releases a reservation whose [`Reservation`] still
    /// exists leaves that reservation's window writable over blocks that are a file's
    /// or free: the caller must not write through such a window afterwards.
    pub unsafe fn submit_unchecked(&mut self, sqes: &[Sqe]) -> Result<()> {
        if let Some(s) = sqes.iter().find(|s| s.user_data & CALL_USER_DATA != 0) {
            return Err(Error::Invalid(format!(
                "user_data {:#x} has bit 63 set, which names the library's own calls",
                s.user_data
            )));
        }
        self.put(sqes)
    }

    fn put(&mut self, sqes: &[Sqe]) -> Result<()> {
        let entries = self.rings.entries;
        if sqes.len() as u64 > (entries - self.in_flight) as u64 {
            return Err(Error::RingFull);
        }
        let head = self.rings.sq_head().load(Ordering::Acquire);
        let free = entries - self.sq_tail.wrapping_sub(head).min(entries);
        if sqes.len() as u64 > free as u64 {
            return Err(Error::RingFull);
        }
        for s in sqes {
            self.rings.write_sqe(self.sq_tail, s);
            self.sq_tail = self.sq_tail.wrapping_add(1);
        }
        self.in_flight += sqes.len() as u32;
        self.rings.sq_tail().store(self.sq_tail, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.rings.server_flags().load(Ordering::Relaxed) & ring::NEED_WAKEUP != 0 {
            ring::ring_bell(self.bell_in.as_fd());
        }
        Ok(())
    }

    /// Completions ready now, without waiting.
    pub fn reap(&mut self, out: &mut Vec<Cqe>) -> usize {
        let tail = self.rings.cq_tail().load(Ordering::Acquire);
        let mut n = 0;
        while self.cq_head != tail && n < self.rings.entries {
            out.push(self.rings.read_cqe(self.cq_head));
            self.cq_head = self.cq_head.wrapping_add(1);
            n += 1;
        }
        if n > 0 {
            self.in_flight = self.in_flight.saturating_sub(n);
            self.rings.cq_head().store(self.cq_head, Ordering::Release);
            // The server may sleep on a full completion ring: room now.
            fence(Ordering::SeqCst);
            if self.rings.server_flags().load(Ordering::Relaxed) & ring::NEED_WAKEUP != 0 {
                ring::ring_bell(self.bell_in.as_fd());
            }
        }
        n as usize
    }

    /// Wait until at least `min` completions (besides those already returned) are
    /// here, and return every one ready. More than are in flight or kept: EINVAL (they
    /// would never come).
    pub fn wait(&mut self, min: usize) -> Result<Vec<Cqe>> {
        if min > self.stash.len() + self.in_flight as usize {
            return Err(Error::Invalid(format!(
                "waiting for {min} completions with {} in flight",
                self.stash.len() + self.in_flight as usize
            )));
        }
        let mut out: Vec<Cqe> = std::mem::take(&mut self.stash);
        loop {
            self.reap(&mut out);
            if out.len() >= min {
                return Ok(out);
            }
            self.wait_event()?;
        }
    }

    /// Spin a bounded while for a completion, then sleep on the eventfd (or notice
    /// the server closing the socket).
    fn wait_event(&mut self) -> Result<()> {
        let ready = |c: &Client| c.rings.cq_tail().load(Ordering::Acquire) != c.cq_head;
        let start = Instant::now();
        while start.elapsed() < self.spin {
            if ready(self) {
                return Ok(());
            }
            // Yield (see the server's spin): the server may need this CPU.
            std::thread::yield_now();
        }
        self.rings
            .app_flags()
            .store(ring::APP_WAITING, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !ready(self) {
            let mut fds = [
                PollFd::new(&self.bell_out, PollFlags::IN),
                PollFd::new(&self.conn.sock, PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, None) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
            // The server sends nothing unasked: a readable socket is its end.
            if !fds[1].revents().is_empty() && !ready(self) {
                self.rings.app_flags().store(0, Ordering::SeqCst);
                return Err(Error::Disconnected);
            }
            ring::clear_bell(self.bell_out.as_fd());
        }
        self.rings.app_flags().store(0, Ordering::SeqCst);
        Ok(())
    }

    /// Submit one entry and wait for its completion; an error completion becomes
    /// [`Error::Errno`]. COMMIT and RESERVATION_RELEASE are refused (EINVAL), as by
    /// [`Client::submit`].
    pub fn call(&mut self, sqe: Sqe) -> Result<Cqe> {
        if ends_reservations(sqe.op) {
            return Err(ends_reservations_error(sqe.op));
        }
        self.run(sqe)
    }

    /// [`Client::call`] without the refusal of COMMIT and RESERVATION_RELEASE.
    ///
    /// # Safety
    /// As [`Client::submit_unchecked`].
    pub unsafe fn call_unchecked(&mut self, sqe: Sqe) -> Result<Cqe> {
        self.run(sqe)
    }

    /// Submit one entry (any op: the library's own calls) and wait for it.
    fn run(&mut self, mut sqe: Sqe) -> Result<Cqe> {
        self.next_user_data += 1;
        let ud = self.next_user_data;
        sqe.user_data = ud;
        self.put(&[sqe])?;
        loop {
            // Kept in order and whole: the application's own entries may share a
            // user_data value (0 is common); `wait` returns them all.
            if let Some(i) = self.stash.iter().position(|c| c.user_data == ud) {
                let c = self.stash.remove(i);
                return if c.result < 0 {
                    Err(Error::Errno((-c.result) as i32))
                } else {
                    Ok(c)
                };
            }
            let mut got = Vec::new();
            if self.reap(&mut got) == 0 {
                self.wait_event()?;
            }
            self.stash.extend(got);
        }
    }

    /// Shared buffer: read `len` bytes at `off` of the file into `buf` at `buf_off`.
    /// Returns bytes read (short at the end of the file).
    pub fn read(
        &mut self,
        h: Handle,
        off: u64,
        buf: BufferId,
        buf_off: u64,
        len: u64,
    ) -> Result<usize> {
        let c = self.run(Sqe {
            op: op::READ,
            handle: h,
            offset: off,
            len,
            buf,
            buf_off,
            ..Default::default()
        })?;
        Ok(c.result as usize)
    }

    /// Shared buffer: write `len` bytes from `buf` at `buf_off` to `off` of the file.
    pub fn write(
        &mut self,
        h: Handle,
        off: u64,
        buf: BufferId,
        buf_off: u64,
        len: u64,
    ) -> Result<usize> {
        let c = self.run(Sqe {
            op: op::WRITE,
            handle: h,
            offset: off,
            len,
            buf,
            buf_off,
            ..Default::default()
        })?;
        Ok(c.result as usize)
    }

    pub fn fsync(&mut self, h: Handle) -> Result<()> {
        self.run(Sqe {
            op: op::FSYNC,
            handle: h,
            ..Default::default()
        })
        .map(|_| ())
    }

    /// FLAC `pfree`: release the pages of `[off, off+len)` (a hole remains).
    pub fn pfree(&mut self, h: Handle, off: u64, len: u64) -> Result<()> {
        self.run(Sqe {
            op: op::PFREE,
            handle: h,
            offset: off,
            len,
            ..Default::default()
        })
        .map(|_| ())
    }

    fn scratch(&mut self) -> Result<BufferId> {
        match self.scratch {
            Some(id) => Ok(id),
            None => {
                let id = self.register_buffer(SCRATCH_LEN)?;
                self.scratch = Some(id);
                Ok(id)
            }
        }
    }

    /// Ask for the direct map: the image mapped read-only here (trusted applications
    /// only; [`Error::Server`] with EPERM otherwise).
    pub fn direct_map(&mut self) -> Result<&DirectMap> {
        if self.direct.is_none() {
            let (g, mut fds) = match call(&self.conn.sock, &Request::DirectMap, &[])? {
                (Reply::DirectMap(g), fds) => (g, fds),
                (r, _) => return Err(unexpected(r)),
            };
            let changes = fds.pop().expect("count checked");
            let rw = fds.pop().expect("count checked");
            let ro = fds.pop().expect("count checked");
            if g.change_slots == 0 {
                return Err(Error::Invalid("the server gave no change counters".into()));
            }
            let changes = Mapping::map(changes.as_fd(), 0, g.change_slots as usize * 8, false)?;
            let map = Mapping::map(ro.as_fd(), 0, g.image_size as usize, false)?;
            let rw_map = Arc::new(Mapping::map(rw.as_fd(), 0, g.image_size as usize, true)?);
            let populating_is_free = zcfs_pmem::populating_is_free(rw.as_fd());
            if populating_is_free {
                prefault_window(Arc::downgrade(&rw_map), g.data_start, g.data_end);
            }
            drop(rw);
            self.direct = Some(DirectMap {
                map,
                changes,
                rw_map,
                populating_is_free,
                geometry: g,
            });
        }
        Ok(self.direct.as_ref().expect("set"))
    }

    /// Direct map: fault the whole data area of the writable mapping in now, from the
    /// calling thread, so that no fill of a reservation takes a page fault: a cost paid
    /// once per process at setup (1.7-2.6 s for a 5 GiB tmpfs image here) instead of
    /// in the first writes to each block (a 2 GiB checkpoint's first save took 1.3-1.6 s
    /// instead of 0.5 s). True when done; false, nothing done, where populating is not
    /// known to be free (`zcfs_pmem::populating_is_free`: an image with holes, on disk,
    /// or a DAX device, which the client does not check for).
    pub fn prefault_window(&mut self) -> Result<bool> {
        let d = self.direct_map()?;
        if !d.populating_is_free {
            return Ok(false);
        }
        let page = rustix::param::page_size() as u64;
        let g = d.geometry;
        let (start, end) = (
            g.data_start.next_multiple_of(page),
            g.data_end - g.data_end % page,
        );
        if end > start {
            d.rw_map
                .populate_now(start as usize, (end - start) as usize, WINDOW_PREFAULT_STEP)?;
        }
        Ok(true)
    }

    /// The direct map, once granted.
    pub fn mapped(&self) -> Option<&DirectMap> {
        self.direct.as_ref()
    }

    /// Direct map: lease the blocks of `[off, off+len)` and return where they are in
    /// the image (read them with [`DirectMap::bytes`]). They stay as they are, whatever
    /// writers do to the file, until [`Client::release`].
    pub fn read_extents(&mut self, h: Handle, off: u64, len: u64) -> Result<LeaseView> {
        self.release_transient()?;
        // Longer than the server leases at all: no room made would help.
        if let Some(g) = self.direct.as_ref().map(|d| &d.geometry) {
            if len > crate::server::MAX_LEASED_BLOCKS * g.block_size as u64 {
                return Err(Error::Errno(libc::ENOBUFS));
            }
        }
        loop {
            match self.lease_extents(h, off, len) {
                // The server's bound on leases: chunks kept for mapped reads (none of a
                // read under way: `read_extents` is not called during one) make room.
                Err(Error::Errno(libc::ENOBUFS)) if self.evict_mapped(u64::MAX)? => {}
                r => return r,
            }
        }
    }

    fn lease_extents(&mut self, h: Handle, off: u64, len: u64) -> Result<LeaseView> {
        if self.direct.is_none() {
            return Err(Error::NoDirectMap);
        }
        let s = self.scratch()?;
        let c = self.run(Sqe {
            op: op::READ_EXTENTS,
            handle: h,
            offset: off,
            len,
            buf: s,
            buf_off: 0,
            aux: MAX_EXTENTS_PER_CALL as u64,
            ..Default::default()
        })?;
        let n = (c.result as usize).min(MAX_EXTENTS_PER_CALL);
        let b = self.buffer(s)?;
        let extents = (0..n)
            .map(|i| {
                let at = i * ring::EXTENT_DESC_SIZE;
                ExtentDesc::decode(b[at..at + ring::EXTENT_DESC_SIZE].try_into().unwrap())
            })
            .collect();
        Ok(LeaseView {
            id: c.extra,
            extents,
            bytes: c.extra2,
        })
    }

    /// Direct map, kept leases: `[off, off+len)` of `h` as pieces in place in the
    /// image (short at the end of the file), zero copies and, while the file does not
    /// change, no call to the server: the chunks of [`MAPPED_CHUNK`] bytes a read
    /// touches are leased once and kept, and each later read checks the file's change
    /// counter with one load ([`DirectMap::change_count`]). A changed counter (the
    /// file, or one sharing its slot, changed) leases the chunk again. The pieces are
    /// one state of the file: that of the counter's load, or of the lease if one was
    /// taken. Kept chunks are given back at `close`, at [`Client::forget_mapped`], when
    /// [`MAPPED_CHUNKS_MAX`] are kept, or when an explicit lease needs the room.
    pub fn read_mapped(&mut self, h: Handle, off: u64, len: u64) -> Result<Vec<Piece<'_>>> {
        self.release_transient()?;
        let slot = *self.slots.get(&h).ok_or(Error::Errno(libc::EBADF))?;
        let end = off
            .checked_add(len)
            .ok_or_else(|| Error::Invalid("a read past the largest offset".into()))?;
        if self.direct.is_none() {
            return Err(Error::NoDirectMap);
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        if self.alive_checked.elapsed() >= MAPPED_ALIVE_CHECK {
            self.check_alive()?;
        }
        self.mapped_reads += 1;
        let this_read = self.mapped_reads;
        let first = off / MAPPED_CHUNK;
        let mut chunks = first..first;
        let mut transient = None;
        let mut consistent = false;
        for _ in 0..MAPPED_ATTEMPTS {
            let now = self.change_count(slot)?;
            // Up to the chunk that holds the end of the file (short: its extents stop
            // there), in the state of `now` like the others: none past it is leased.
            chunks = first..first;
            for i in first..end.div_ceil(MAPPED_CHUNK) {
                self.ensure_chunk(h, i, now, this_read)?;
                chunks.end = i + 1;
                let covered: u64 = self.mapped[&(h, i)].extents.iter().map(|e| e.len).sum();
                if covered < MAPPED_CHUNK {
                    break;
                }
            }
            // One chunk is one state whatever happened; several are if the counter
            // did not move while they were made sure of (every chunk then has `now`).
            if chunks.end - chunks.start == 1 || self.change_count(slot)? == now {
                consistent = true;
                break;
            }
        }
        if !consistent {
            // The file keeps changing under a read of several chunks: one lease of
            // the range gives one state (as long a range as the server leases: the
            // chunks were fewer than MAPPED_CHUNKS_MAX).
            let g = &self.direct.as_ref().expect("checked above").geometry;
            let most = crate::server::MAX_LEASED_BLOCKS * g.block_size as u64;
            let l = self.read_extents(h, off, len.min(most))?;
            // Given back by the next call, whatever happens below.
            self.transient = Some(l.id);
            transient = Some(l);
        }
        let map = self.direct.as_ref().expect("checked above");
        let mut pieces = Vec::new();
        let mut push = |e: &ExtentDesc, from: u64, to: u64| -> Result<()> {
            let (start, stop) = (from.max(e.file_offset), to.min(e.file_offset + e.len));
            if start >= stop {
                return Ok(());
            }
            let part = ExtentDesc {
                file_offset: start,
                image_offset: e.image_offset + (start - e.file_offset),
                len: stop - start,
                flags: e.flags,
            };
            pieces.push(match map.bytes(&part) {
                Some(b) => Piece::Data(b),
                None if part.is_hole() => Piece::Hole(part.len),
                None => {
                    return Err(Error::Invalid(format!(
                        "an extent outside the image: {} + {}",
                        part.image_offset, part.len
                    )))
                }
            });
            Ok(())
        };
        match &transient {
            Some(l) => {
                for e in &l.extents {
                    push(e, off, end)?;
                }
            }
            None => {
                for i in chunks {
                    let c = &self.mapped[&(h, i)];
                    for e in &c.extents {
                        push(e, off, end)?;
                    }
                }
            }
        }
        // (Leases stop at the end of the file, so the pieces do.)
        Ok(pieces)
    }

    /// Whether the server is still there (its end of the control socket open): if not,
    /// the kept chunks are forgotten (their leases went with it) and the read fails.
    fn check_alive(&mut self) -> Result<()> {
        let mut fds = [PollFd::new(
            &self.conn.sock,
            PollFlags::IN | PollFlags::RDHUP,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        // The server sends nothing unasked on the control socket: readable means its
        // end closed.
        let r = fds[0].revents();
        if r.intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR | PollFlags::IN) {
            self.mapped.clear();
            self.transient = None;
            return Err(Error::Disconnected);
        }
        self.alive_checked = Instant::now();
        Ok(())
    }

    /// The counter of `slot` (the direct map is there).
    fn change_count(&self, slot: u32) -> Result<u64> {
        self.direct
            .as_ref()
            .ok_or(Error::NoDirectMap)?
            .change_count(slot)
            .ok_or_else(|| Error::Invalid(format!("the server gave change slot {slot}")))
    }

    /// Make sure chunk `i` of `h` is kept leased as of counter `now`, for read
    /// `this_read`.
    fn ensure_chunk(&mut self, h: Handle, i: u64, now: u64, this_read: u64) -> Result<()> {
        if let Some(c) = self.mapped.get_mut(&(h, i)) {
            if c.count == now {
                c.used = this_read;
                return Ok(());
            }
            let c = self.mapped.remove(&(h, i)).expect("found above");
            self.release(c.lease)?;
        }
        if self.mapped.len() >= MAPPED_CHUNKS_MAX && !self.evict_mapped(this_read)? {
            return Err(Error::Errno(libc::ENOBUFS));
        }
        let l = loop {
            match self.lease_extents(h, i * MAPPED_CHUNK, MAPPED_CHUNK) {
                Err(Error::Errno(libc::ENOBUFS)) if self.evict_mapped(this_read)? => {}
                r => break r?,
            }
        };
        self.mapped.insert(
            (h, i),
            MappedChunk {
                lease: l.id,
                extents: l.extents,
                count: now,
                used: this_read,
            },
        );
        Ok(())
    }

    /// Give back the least recently read kept chunk not used by read `keep` (or by
    /// any later one). Whether there was one.
    fn evict_mapped(&mut self, keep: u64) -> Result<bool> {
        let Some(&key) = self
            .mapped
            .iter()
            .filter(|(_, c)| c.used < keep)
            .min_by_key(|(_, c)| c.used)
            .map(|(k, _)| k)
        else {
            return Ok(false);
        };
        let c = self.mapped.remove(&key).expect("found above");
        self.release(c.lease)?;
        Ok(true)
    }

    /// Give back the chunks kept for mapped reads: of `handle`, or all.
    pub fn forget_mapped(&mut self, handle: Option<Handle>) -> Result<()> {
        self.release_transient()?;
        let keys: Vec<_> = self
            .mapped
            .keys()
            .filter(|(h, _)| handle.is_none_or(|x| x == *h))
            .copied()
            .collect();
        for k in keys {
            let c = self.mapped.remove(&k).expect("listed above");
            self.release(c.lease)?;
        }
        Ok(())
    }

    /// Chunks kept leased for mapped reads.
    pub fn mapped_chunks(&self) -> usize {
        self.mapped.len()
    }

    fn release_transient(&mut self) -> Result<()> {
        if let Some(id) = self.transient.take() {
            self.release(id)?;
        }
        Ok(())
    }

    /// End a lease.
    pub fn release(&mut self, lease: u64) -> Result<()> {
        self.run(Sqe {
            op: op::LEASE_RELEASE,
            aux: lease,
            ..Default::default()
        })
        .map(|_| ())
    }

    /// Direct map: reserve `pages` fresh zeroed blocks, to fill through
    /// [`Reservation::window`]. (First gives back reservations dropped unused.)
    pub fn reserve(&mut self, pages: usize) -> Result<Reservation> {
        let rw_map = match &self.direct {
            Some(d) => d.rw_map.clone(),
            None => return Err(Error::NoDirectMap),
        };
        if pages == 0 || pages > MAX_RESERVE_PER_CALL {
            return Err(Error::Invalid(format!(
                "reserve {pages} pages (1..={MAX_RESERVE_PER_CALL} per call)"
            )));
        }
        self.give_back_dropped();
        let s = self.scratch()?;
        let c = self.run(Sqe {
            op: op::RESERVE,
            len: pages as u64,
            buf: s,
            ..Default::default()
        })?;
        let b = self.buffer(s)?;
        let offsets: Vec<u64> = (0..pages)
            .map(|i| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()))
            .collect();
        let r = Reservation {
            id: c.extra,
            offsets,
            map: rw_map,
            conn: self.conn.clone(),
            held: true,
        };
        // The window's views rest on this check (the server is another process).
        let g = self.direct.as_ref().expect("checked above").geometry;
        if !pages_inside(&g, r.map.len(), &r.offsets) {
            let _ = self.release_reservation(r);
            return Err(Error::Invalid(
                "the server reserved a page outside the data area".into(),
            ));
        }
        Ok(r)
    }

    /// Direct map: place reservations into files, all in one atomic commit (after a
    /// crash all of them are in their files or none is). At most
    /// [`MAX_PLACEMENTS_PER_COMMIT`].
    ///
    /// The reservations are consumed either way. On success their blocks are the
    /// files'; on failure they are given back: the server keeps a reservation it
    /// refused at its checks but gives back those the volume refused, and the error
    /// does not say which, so the client gives back the rest (reserve and fill again).
    pub fn commit(&mut self, places: Vec<Place>) -> Result<()> {
        match self.send_commit(&places) {
            Ok(()) => {
                for p in places {
                    p.reservation.consumed();
                }
                Ok(())
            }
            Err(e) => {
                // Each reservation's drop queues it on its own connection.
                drop(places);
                self.give_back_dropped();
                Err(e)
            }
        }
    }

    fn send_commit(&mut self, places: &[Place]) -> Result<()> {
        if self.direct.is_none() {
            return Err(Error::NoDirectMap);
        }
        if places.is_empty() || places.len() > MAX_PLACEMENTS_PER_COMMIT {
            return Err(Error::Invalid(format!(
                "commit of {} placements (1..={MAX_PLACEMENTS_PER_COMMIT})",
                places.len()
            )));
        }
        if places
            .iter()
            .any(|p| !Arc::ptr_eq(&p.reservation.conn, &self.conn))
        {
            return Err(Error::Invalid("a reservation of another connection".into()));
        }
        let s = self.scratch()?;
        let b = self.buffer_mut(s)?;
        for (i, p) in places.iter().enumerate() {
            let wire = Placement {
                handle: p.handle,
                file_offset: p.file_offset,
                reservation: p.reservation.id,
                new_size: p.new_size,
            };
            b[i * ring::PLACEMENT_SIZE..(i + 1) * ring::PLACEMENT_SIZE]
                .copy_from_slice(&wire.encode());
        }
        self.run(Sqe {
            op: op::COMMIT,
            len: places.len() as u64,
            buf: s,
            ..Default::default()
        })
        .map(|_| ())
    }

    /// Give a reservation back unused (consumed even when the call fails: the server
    /// gives it back when the connection ends, if not before).
    pub fn release_reservation(&mut self, r: Reservation) -> Result<()> {
        if !Arc::ptr_eq(&r.conn, &self.conn) {
            // Dropped: its own client gives it back.
            return Err(Error::Invalid("a reservation of another connection".into()));
        }
        let id = r.consumed();
        self.release_id(id)
    }

    /// Send RESERVATION_RELEASE for `id`. An errno means the server does not hold it
    /// any more (given back already); any other failure (a full ring, a lost
    /// connection) queues it with the ones dropped unused, for the next try (review
    /// finding: a release on a full ring forgot it until the connection closed).
    fn release_id(&mut self, id: u64) -> Result<()> {
        let r = self.run(Sqe {
            op: op::RESERVATION_RELEASE,
            aux: id,
            ..Default::default()
        });
        if let Err(e) = &r {
            if !matches!(e, Error::Errno(_)) {
                let mut q = self.conn.dropped.lock().unwrap_or_else(|e| e.into_inner());
                q.push(id);
            }
        }
        r.map(|_| ())
    }

    /// Give back the reservations dropped unused (`release_id`); at the first that
    /// cannot be sent, the rest stay queued for the next try (on a lost connection the
    /// server gave them all back).
    fn give_back_dropped(&mut self) {
        let mut ids =
            std::mem::take(&mut *self.conn.dropped.lock().unwrap_or_else(|e| e.into_inner()));
        while let Some(id) = ids.pop() {
            if let Err(e) = self.release_id(id) {
                if !matches!(e, Error::Errno(_)) {
                    let mut q = self.conn.dropped.lock().unwrap_or_else(|e| e.into_inner());
                    q.extend(ids);
                    return;
                }
            }
        }
    }

    /// Reservations dropped unused and not yet given back (tests).
    #[doc(hidden)]
    pub fn dropped_reservations_for_tests(&self) -> usize {
        self.conn.dropped.lock().map_or(0, |q| q.len())
    }

    /// The rings (tests: to damage them on purpose).
    ///
    /// # Safety
    /// As [`Client::submit_unchecked`]: entries written here are not checked.
    #[doc(hidden)]
    pub unsafe fn rings_for_tests(&self) -> &Rings {
        &self.rings
    }

    /// Ring the server's doorbell (tests: after damaging the rings).
    #[doc(hidden)]
    pub fn doorbell_for_tests(&self) {
        ring::ring_bell(self.bell_in.as_fd());
    }
}

/// COMMIT and RESERVATION_RELEASE end reservations: only the typed calls send them.
fn ends_reservations(op: u8) -> bool {
    op == op::COMMIT || op == op::RESERVATION_RELEASE
}

fn ends_reservations_error(op: u8) -> Error {
    Error::Invalid(format!(
        "op {op} ends a reservation: use Client::commit or Client::release_reservation, \
         which consume it and so its window"
    ))
}

fn unexpected(r: Reply) -> Error {
    match r {
        Reply::Error { errno, message } => Error::Server { errno, message },
        r => Error::Invalid(format!("unexpected reply {r:?}")),
    }
}

/// One control round trip; the reply's descriptor count is checked.
fn call(
    sock: &UnixStream,
    req: &Request,
    fds: &[rustix::fd::BorrowedFd<'_>],
) -> Result<(Reply, Vec<OwnedFd>)> {
    proto::send(sock, &req.encode(), fds).map_err(disconnected)?;
    let (body, fds) = proto::recv(sock)
        .map_err(disconnected)?
        .ok_or(Error::Disconnected)?;
    let reply = Reply::decode(&body)?;
    if let Reply::Error { errno, message } = reply {
        return Err(Error::Server { errno, message });
    }
    if fds.len() != reply.fds() {
        return Err(ProtoError::Fds {
            got: fds.len(),
            want: reply.fds(),
        }
        .into());
    }
    Ok((reply, fds))
}

fn disconnected(e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::BrokenPipe
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::UnexpectedEof => Error::Disconnected,
        _ => Error::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_takes_only_whole_pages_inside_the_data_area_and_the_mapping() {
        let g = MapGeometry {
            data_start: 1 << 20,
            data_end: 4 << 20,
            block_size: 4096,
            image_size: 4 << 20,
            change_slots: 4096,
        };
        let map = 4 << 20;
        assert!(pages_inside(&g, map, &[1 << 20, (4 << 20) - 4096]));
        assert!(pages_inside(&g, map, &[]));
        for bad in [
            0,
            (1 << 20) - 4096,
            (1 << 20) + 1,
            4 << 20,
            u64::MAX - 4095,
            u64::MAX,
        ] {
            assert!(!pages_inside(&g, map, &[1 << 20, bad]), "{bad}");
        }
        // Inside the data area but past a (short) mapping.
        assert!(!pages_inside(&g, 2 << 20, &[3 << 20]));
    }
}
