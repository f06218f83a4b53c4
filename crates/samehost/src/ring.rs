//! The rings in shared memory: one memfd the server makes (and seals against
//! resizing) holding a header, a submission ring and a completion ring, each
//! single-producer single-consumer with head and tail counters (`u32`, wrapping) stored
//! with Release and loaded with Acquire. Entries are 3FS's Ior in spirit: a request
//! names a file handle, a file offset and length, and a place in a registered buffer.
//!
//! Layout (all little-endian, offsets in bytes; each counter on its own cache line):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `ZCSH` (u32), version (u32), entries (u32), reserved (u32), total size (u64) |
//! | 64 | submission tail (u32): the application advances it |
//! | 128 | submission head (u32): the server advances it |
//! | 192 | completion tail (u32): the server advances it |
//! | 256 | completion head (u32): the application advances it |
//! | 320 | server flags (u32): [`NEED_WAKEUP`] |
//! | 384 | application flags (u32): [`APP_WAITING`] |
//! | 512 | `entries` submission entries of [`SQE_SIZE`] bytes ([`Sqe`]) |
//! | 512 + 64·entries | `entries` completion entries of [`CQE_SIZE`] bytes ([`Cqe`]) |
//!
//! The server treats all of it as hostile: it keeps its own copies of the counters it
//! owns, copies each entry out before looking at it, and closes the connection when the
//! application's counters say something impossible (more entries than the ring has).

use rustix::fd::{AsFd, BorrowedFd};
use rustix::mm::{MapFlags, ProtFlags};
use std::sync::atomic::{AtomicU32, AtomicU64};

pub const RING_MAGIC: u32 = u32::from_le_bytes(*b"ZCSH");
pub const RING_VERSION: u32 = 1;
/// Fewest and most entries of each ring (a power of two between).
pub const MIN_RING_ENTRIES: u32 = 2;
pub const MAX_RING_ENTRIES: u32 = 4096;
/// Entries a client asks for unless told otherwise.
pub const DEFAULT_RING_ENTRIES: u32 = 256;
pub const HEADER_SIZE: usize = 512;
pub const SQE_SIZE: usize = 64;
pub const CQE_SIZE: usize = 32;

pub const OFF_SQ_TAIL: usize = 64;
pub const OFF_SQ_HEAD: usize = 128;
pub const OFF_CQ_TAIL: usize = 192;
pub const OFF_CQ_HEAD: usize = 256;
pub const OFF_SERVER_FLAGS: usize = 320;
pub const OFF_APP_FLAGS: usize = 384;

/// Server flag: the server sleeps on its eventfd; a submitter must write it.
pub const NEED_WAKEUP: u32 = 1;
/// Application flag: the application sleeps on its eventfd; the server writes it after
/// posting completions.
pub const APP_WAITING: u32 = 1;

/// Operation codes of a submission entry.
pub mod op {
    /// Nothing (completes with 0): a ring round trip.
    pub const NOP: u8 = 0;
    /// Shared buffer: read `len` bytes at `offset` of `handle` into buffer `buf` at
    /// `buf_off`. Result: bytes read (short at the end of the file).
    pub const READ: u8 = 1;
    /// Shared buffer: write `len` bytes from buffer `buf` at `buf_off` to `offset` of
    /// `handle`. Result: bytes written.
    pub const WRITE: u8 = 2;
    /// Make the file's data and metadata durable. Result: 0.
    pub const FSYNC: u8 = 3;
    /// Direct map: lease the blocks of `[offset, offset+len)` of `handle` and write
    /// up to `aux` extent descriptors ([`super::ExtentDesc`]) into buffer `buf` at
    /// `buf_off`. Result: descriptors written; `extra`: the lease id; `extra2`: bytes
    /// covered (short at the end of the file).
    pub const READ_EXTENTS: u8 = 4;
    /// Direct map: end lease `aux`. Result: 0.
    pub const LEASE_RELEASE: u8 = 5;
    /// Direct map: reserve `len` fresh zeroed blocks; their byte offsets in the image
    /// (u64 each) go into buffer `buf` at `buf_off`. Result: `len`; `extra`: the
    /// reservation id.
    pub const RESERVE: u8 = 6;
    /// Direct map: place `len` placements ([`super::Placement`], read from buffer
    /// `buf` at `buf_off`) as one atomic commit. Result: 0.
    pub const COMMIT: u8 = 7;
    /// Release the pages of `[offset, offset+len)` of `handle` (a hole remains).
    /// Result: 0.
    pub const PFREE: u8 = 8;
    /// Direct map: give reservation `aux` back unused. Result: 0.
    pub const RESERVATION_RELEASE: u8 = 9;
}

/// A submission entry (64 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sqe {
    pub user_data: u64,
    pub op: u8,
    pub flags: u8,
    pub reserved: u16,
    pub handle: u32,
    pub offset: u64,
    pub len: u64,
    pub buf: u32,
    pub reserved2: u32,
    pub buf_off: u64,
    pub aux: u64,
    pub aux2: u64,
}

/// A completion entry (32 bytes): `result` is the bytes (or count) done, or -errno.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cqe {
    pub user_data: u64,
    pub result: i64,
    pub extra: u64,
    pub extra2: u64,
}

const _: () = assert!(std::mem::size_of::<Sqe>() == SQE_SIZE);
const _: () = assert!(std::mem::size_of::<Cqe>() == CQE_SIZE);

/// An extent descriptor READ_EXTENTS writes (32 bytes, little-endian): `len` bytes of
/// the file from `file_offset` at byte `image_offset` of the image, or a hole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtentDesc {
    pub file_offset: u64,
    pub image_offset: u64,
    pub len: u64,
    pub flags: u64,
}

/// `ExtentDesc::flags`: the extent is a hole (reads as zeros; `image_offset` is 0).
pub const EXTENT_HOLE: u64 = 1;
pub const EXTENT_DESC_SIZE: usize = 32;

impl ExtentDesc {
    pub fn encode(&self) -> [u8; EXTENT_DESC_SIZE] {
        let mut b = [0u8; EXTENT_DESC_SIZE];
        for (i, v) in [self.file_offset, self.image_offset, self.len, self.flags]
            .into_iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
    pub fn decode(b: &[u8; EXTENT_DESC_SIZE]) -> ExtentDesc {
        let f = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        ExtentDesc {
            file_offset: f(0),
            image_offset: f(1),
            len: f(2),
            flags: f(3),
        }
    }
    pub fn is_hole(&self) -> bool {
        self.flags & EXTENT_HOLE != 0
    }
}

/// One placement of a COMMIT (32 bytes, little-endian): reservation `reservation`'s
/// pages go to block-aligned `file_offset` of `handle`; the file grows to `new_size`
/// (inside the last page), or with [`NO_NEW_SIZE`] to the end of the last page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Placement {
    pub handle: u32,
    pub file_offset: u64,
    pub reservation: u64,
    pub new_size: u64,
}

pub const NO_NEW_SIZE: u64 = u64::MAX;
pub const PLACEMENT_SIZE: usize = 32;

impl Placement {
    pub fn encode(&self) -> [u8; PLACEMENT_SIZE] {
        let mut b = [0u8; PLACEMENT_SIZE];
        b[0..4].copy_from_slice(&self.handle.to_le_bytes());
        b[8..16].copy_from_slice(&self.file_offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.reservation.to_le_bytes());
        b[24..32].copy_from_slice(&self.new_size.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8; PLACEMENT_SIZE]) -> Placement {
        let f = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().unwrap());
        Placement {
            handle: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            file_offset: f(8..16),
            reservation: f(16..24),
            new_size: f(24..32),
        }
    }
}

/// Bytes of the rings' memfd for `entries` entries each (whole pages).
pub fn ring_size(entries: u32) -> usize {
    let n = entries as usize;
    (HEADER_SIZE + n * (SQE_SIZE + CQE_SIZE)).next_multiple_of(4096)
}

pub fn valid_entries(entries: u32) -> bool {
    (MIN_RING_ENTRIES..=MAX_RING_ENTRIES).contains(&entries) && entries.is_power_of_two()
}

/// A shared mapping of a memfd (rings or a buffer), unmapped on drop. Accessed only
/// through raw pointers: the other process may store into it at any time.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is plain shared memory, accessed only through raw pointers and
// atomics; moving the owner between threads changes nothing.
unsafe impl Send for Mapping {}
// SAFETY: as above: no method hands out references to the mapped bytes.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of `fd` from `offset`, shared; `writable` or read-only.
    pub fn map(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        writable: bool,
    ) -> std::io::Result<Mapping> {
        Mapping::map_with(fd, offset, len, writable, MapFlags::empty())
    }

    /// `map`, with the page tables filled at once (no fault per page later).
    pub fn map_populated(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        writable: bool,
    ) -> std::io::Result<Mapping> {
        Mapping::map_with(fd, offset, len, writable, MapFlags::POPULATE)
    }

    fn map_with(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        writable: bool,
        extra: MapFlags,
    ) -> std::io::Result<Mapping> {
        if len == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a fresh mapping the kernel places (no address given); nothing else
        // in this process refers to it.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                MapFlags::SHARED | extra,
                fd.as_fd(),
                offset,
            )?
        };
        Ok(Mapping {
            ptr: ptr as *mut u8,
            len,
            writable,
        })
    }
    /// Fault `[off, off+len)` in writable ([`zcfs_pmem::touch_writable`]: no lock of the
    /// address space held between pages), so that stores there take no page fault; the
    /// contents do not change. `off` and `len` are page multiples inside a writable
    /// mapping, else EINVAL (nothing done). On a file with holes this allocates their
    /// pages.
    pub fn populate_writable(&self, off: usize, len: usize) -> std::io::Result<()> {
        self.check_writable_range(off, len)?;
        // SAFETY: a page-aligned range inside this live, shared, writable mapping
        // (checked above; `&self` keeps it mapped for the call).
        unsafe { zcfs_pmem::touch_writable(self.ptr.add(off), len) };
        Ok(())
    }
    /// Fill the page tables of `[off, off+len)` writable now, from this thread
    /// (MADV_POPULATE_WRITE, `step` bytes per call so that the address-space lock is
    /// let go between calls). Faster per page than faulting (~1 µs against ~2 here), for
    /// a caller at normal priority that wants the cost paid now. Same checks and errors
    /// as [`Mapping::populate_writable`].
    pub fn populate_now(&self, off: usize, len: usize, step: usize) -> std::io::Result<()> {
        self.check_writable_range(off, len)?;
        if step == 0 || !step.is_multiple_of(rustix::param::page_size()) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut at = off;
        while at < off + len {
            let n = step.min(off + len - at);
            // SAFETY: a page-aligned range inside this live, shared, writable mapping
            // (checked above); populating changes no byte.
            unsafe {
                rustix::mm::madvise(
                    self.ptr.add(at) as *mut _,
                    n,
                    rustix::mm::Advice::LinuxPopulateWrite,
                )?
            };
            at += n;
        }
        Ok(())
    }
    /// EINVAL unless `[off, off+len)` is a page-aligned range inside this writable
    /// mapping.
    fn check_writable_range(&self, off: usize, len: usize) -> std::io::Result<()> {
        let page = rustix::param::page_size();
        if !self.writable
            || !off.is_multiple_of(page)
            || !len.is_multiple_of(page)
            || off.checked_add(len).is_none_or(|end| end > self.len)
        {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(())
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Pointer to `len` bytes at `off`, if they lie inside the mapping.
    pub fn range(&self, off: u64, len: u64) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: `off <= end <= self.len`: inside (or one past) the mapping.
        Some(unsafe { self.ptr.add(off as usize) })
    }
    /// The atomic `u32` at `off` (4-aligned, inside the mapping).
    pub fn atomic(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= self.len,
            "atomic outside the mapping"
        );
        // SAFETY: in bounds and aligned (the mapping is page aligned); shared memory
        // is only ever accessed atomically at these offsets by both sides, and an
        // AtomicU32 may alias memory another process stores to.
        unsafe { AtomicU32::from_ptr(self.ptr.add(off) as *mut u32) }
    }
    /// The atomic `u64` at `off` (8-aligned, inside the mapping): the change counters a
    /// peer only loads (a plain load on this platform, fine on a read-only mapping).
    pub fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.len,
            "atomic outside the mapping"
        );
        // SAFETY: in bounds and aligned (the mapping is page aligned); the other
        // process only ever stores to it atomically, and an AtomicU64 may alias memory
        // another process stores to.
        unsafe { AtomicU64::from_ptr(self.ptr.add(off) as *mut u64) }
    }
    /// Copy bytes out of the mapping at `off` into `out` (bounds checked).
    pub fn read_into(&self, off: u64, out: &mut [u8]) -> bool {
        match self.range(off, out.len() as u64) {
            Some(p) => {
                // SAFETY: `p..p+out.len()` is inside the mapping; the peer may store
                // concurrently, which only changes the bytes copied.
                unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
                true
            }
            None => false,
        }
    }
    /// Copy `data` into the mapping at `off` (bounds checked).
    pub fn write_from(&self, off: u64, data: &[u8]) -> bool {
        match self.range(off, data.len() as u64) {
            Some(p) => {
                // SAFETY: as in `read_into`, the other way.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
                true
            }
            None => false,
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; no pointer into it outlives
        // the owner (callers copy in and out).
        unsafe {
            let _ = rustix::mm::munmap(self.ptr as *mut _, self.len);
        }
    }
}

/// The rings inside a mapping, by entry count.
#[derive(Debug)]
pub struct Rings {
    pub map: Mapping,
    pub entries: u32,
}

impl Rings {
    pub fn new(map: Mapping, entries: u32) -> Option<Rings> {
        if !valid_entries(entries) || map.len() < ring_size(entries) {
            return None;
        }
        Some(Rings { map, entries })
    }
    pub fn mask(&self) -> u32 {
        self.entries - 1
    }
    pub fn sq_tail(&self) -> &AtomicU32 {
        self.map.atomic(OFF_SQ_TAIL)
    }
    pub fn sq_head(&self) -> &AtomicU32 {
        self.map.atomic(OFF_SQ_HEAD)
    }
    pub fn cq_tail(&self) -> &AtomicU32 {
        self.map.atomic(OFF_CQ_TAIL)
    }
    pub fn cq_head(&self) -> &AtomicU32 {
        self.map.atomic(OFF_CQ_HEAD)
    }
    pub fn server_flags(&self) -> &AtomicU32 {
        self.map.atomic(OFF_SERVER_FLAGS)
    }
    pub fn app_flags(&self) -> &AtomicU32 {
        self.map.atomic(OFF_APP_FLAGS)
    }
    fn sqe_off(&self, index: u32) -> usize {
        HEADER_SIZE + (index & self.mask()) as usize * SQE_SIZE
    }
    fn cqe_off(&self, index: u32) -> usize {
        HEADER_SIZE + self.entries as usize * SQE_SIZE + (index & self.mask()) as usize * CQE_SIZE
    }
    /// Copy submission entry `index` (mod entries) out of the ring.
    pub fn read_sqe(&self, index: u32) -> Sqe {
        // SAFETY: the offset is inside the mapping (masked index, `new` checked the
        // size) and 64-aligned; every bit pattern is a valid Sqe; volatile because
        // the peer may store concurrently.
        unsafe { std::ptr::read_volatile(self.map.as_ptr().add(self.sqe_off(index)) as *const Sqe) }
    }
    pub fn write_sqe(&self, index: u32, e: &Sqe) {
        // SAFETY: as in `read_sqe`.
        unsafe {
            std::ptr::write_volatile(self.map.as_ptr().add(self.sqe_off(index)) as *mut Sqe, *e)
        }
    }
    pub fn read_cqe(&self, index: u32) -> Cqe {
        // SAFETY: as in `read_sqe`, for the completion ring (32-aligned).
        unsafe { std::ptr::read_volatile(self.map.as_ptr().add(self.cqe_off(index)) as *const Cqe) }
    }
    pub fn write_cqe(&self, index: u32, e: &Cqe) {
        // SAFETY: as in `read_cqe`.
        unsafe {
            std::ptr::write_volatile(self.map.as_ptr().add(self.cqe_off(index)) as *mut Cqe, *e)
        }
    }
    /// Write the header (the server, once, before handing the memfd over).
    pub fn init_header(&self) {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&RING_MAGIC.to_le_bytes());
        h[4..8].copy_from_slice(&RING_VERSION.to_le_bytes());
        h[8..12].copy_from_slice(&self.entries.to_le_bytes());
        h[16..24].copy_from_slice(&(self.map.len() as u64).to_le_bytes());
        self.map.write_from(0, &h);
    }
    /// Whether the header says what the server said it would (the client's check).
    pub fn header_ok(&self) -> bool {
        let mut h = [0u8; 12];
        self.map.read_into(0, &mut h);
        u32::from_le_bytes(h[0..4].try_into().unwrap()) == RING_MAGIC
            && u32::from_le_bytes(h[4..8].try_into().unwrap()) == RING_VERSION
            && u32::from_le_bytes(h[8..12].try_into().unwrap()) == self.entries
    }
}

/// Write 1 to an eventfd (a doorbell).
pub fn ring_bell(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Read (and so clear) an eventfd; false if nothing was there (non-blocking fd).
pub fn clear_bell(fd: BorrowedFd<'_>) -> bool {
    let mut b = [0u8; 8];
    rustix::io::read(fd, &mut b).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_codecs_round_trip() {
        let d = ExtentDesc {
            file_offset: 1,
            image_offset: 2,
            len: 3,
            flags: EXTENT_HOLE,
        };
        assert_eq!(ExtentDesc::decode(&d.encode()), d);
        assert!(d.is_hole());
        let p = Placement {
            handle: 5,
            file_offset: 4096,
            reservation: 9,
            new_size: NO_NEW_SIZE,
        };
        assert_eq!(Placement::decode(&p.encode()), p);
    }

    #[test]
    fn ring_entry_bounds() {
        assert!(!valid_entries(MIN_RING_ENTRIES - 1));
        assert!(valid_entries(MIN_RING_ENTRIES));
        assert!(valid_entries(MAX_RING_ENTRIES));
        assert!(!valid_entries(MAX_RING_ENTRIES * 2));
        assert!(!valid_entries(3));
        assert_eq!(ring_size(MIN_RING_ENTRIES), 4096);
        assert!(ring_size(MAX_RING_ENTRIES) >= HEADER_SIZE + 4096 * 96);
    }

    #[test]
    fn a_mapping_refuses_ranges_outside_it() {
        let fd = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        let m = Mapping::map(fd.as_fd(), 0, 8192, true).unwrap();
        assert!(m.range(0, 8192).is_some());
        assert!(m.range(8192, 0).is_some());
        assert!(m.range(8191, 2).is_none());
        assert!(m.range(u64::MAX, 2).is_none());
        assert!(m.write_from(8188, &[1, 2, 3, 4]));
        assert!(!m.write_from(8189, &[1, 2, 3, 4]));
        let rings = Rings::new(m, 2).unwrap();
        rings.write_sqe(
            3,
            &Sqe {
                user_data: 7,
                ..Default::default()
            },
        );
        assert_eq!(rings.read_sqe(1).user_data, 7, "indices wrap by the mask");
    }

    /// Populating takes page-aligned ranges inside a writable mapping only, and changes
    /// no byte; RSS shows the pages mapped.
    #[test]
    fn populating_takes_aligned_ranges_of_a_writable_mapping_and_changes_nothing() {
        let page = rustix::param::page_size();
        let fd = rustix::fs::memfd_create("p", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 4 * page as u64).unwrap();
        let m = Mapping::map(fd.as_fd(), 0, 4 * page, true).unwrap();
        assert!(m.write_from(page as u64, &[7; 3]));
        let einval = |r: std::io::Result<()>| r.unwrap_err().raw_os_error() == Some(libc::EINVAL);
        assert!(
            einval(m.populate_writable(page, 4 * page)),
            "one page past the end"
        );
        assert!(einval(m.populate_writable(usize::MAX - page + 1, page)));
        assert!(einval(m.populate_writable(1, page)), "unaligned start");
        assert!(einval(m.populate_writable(0, page + 1)), "unaligned length");
        m.populate_writable(0, 4 * page).unwrap();
        m.populate_writable(4 * page, 0).unwrap();
        let mut b = [0u8; 4];
        // SAFETY: inside the mapping, which nothing else writes.
        unsafe { std::ptr::copy_nonoverlapping(m.as_ptr().add(page - 1), b.as_mut_ptr(), 4) };
        assert_eq!(b, [0, 7, 7, 7]);
        let ro = Mapping::map(fd.as_fd(), 0, 4 * page, false).unwrap();
        assert!(einval(ro.populate_writable(0, page)), "a read-only mapping");
    }
}
