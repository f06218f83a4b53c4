//! A mapped persistent-memory region and the one interface every store to it goes through.
//!
//! `Region` maps a file, a DAX device or anonymous memory. Stores are made with
//! [`Region::write`] and friends (or, for zero-copy fills, through [`Region::slice_mut`]);
//! durability is requested with [`Region::flush`] (write-back of a range) and
//! [`Region::fence`] (ordering point: everything flushed before it is durable after it).
//!
//! # The access contract
//!
//! The region is plain shared memory that other threads may be reading through borrowed
//! slices (a reply leaving on a socket, say). So every store, and every borrow, is
//! `unsafe` with one contract: **for as long as a store runs or a borrow lives, no other
//! thread writes the bytes it covers, and a store's bytes are not read by anyone
//! else**. Many readers of a range may coexist; a writer is alone with its range. The
//! owner of the region (the volume) keeps the contract with its own types (fresh blocks
//! known to one transaction, the state lock, read pins); this crate only checks bounds.
//!
//! How a flush is done depends on the mapping, detected at open:
//! - `CacheLine`: the mapping is synchronous (MAP_SYNC on DAX), so user-space cache-line
//!   write-back (clwb, else clflushopt, else clflush, by CPUID) plus sfence is durability.
//! - `Msync`: ordinary page-cache mapping (a file in /dev/shm, any regular file): flushed
//!   page ranges are collected and `msync(MS_SYNC)`ed at the fence.
//! - `Memory`: anonymous memory (tests, fuzzing); nothing to persist to.
//!
//! A recording mode logs every store, flush and fence so tests can build every image a
//! power failure could leave (see [`crash`]).

pub mod crash;
mod flush;
mod record;

pub use flush::FlushInstr;
pub use record::{Event, Recording};

use record::Recorder;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Cache-line size used for flushing and for the crash model.
pub const CACHE_LINE: usize = 64;
const PAGE: usize = 4096;
/// At a fence in `Msync` mode, flushed page ranges at most this far apart are synced
/// with one `msync` over both and the gap between them. Each call costs a system call
/// and a VMA walk (~1 µs here) whatever its length, and a fragmented 1 MiB pflush
/// commit flushes ~100 separate runs of blocks. Syncing a gap only writes back pages
/// that are dirty anyway, earlier than asked, which the persistence model allows (a
/// stored line may become durable at any time before its flush).
pub const MSYNC_MERGE_GAP: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum PmemError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: size {size} is too small or not a multiple of 4096")]
    BadSize { path: PathBuf, size: u64 },
    #[error("{path}: not a regular file or DAX character device")]
    NotRegion { path: PathBuf },
    #[error("persistence mode {0:?} is not available here")]
    ModeUnavailable(PersistMode),
    /// Another process holds the lock this open asked for.
    #[error("{path} is in use by another process")]
    Locked { path: PathBuf },
    /// Making stores durable failed (e.g. msync reported an I/O error): what was
    /// flushed since the last successful fence may not be durable.
    #[error("persisting to {path} failed: {source}")]
    Persist {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, PmemError>;

/// How durability is achieved for this mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistMode {
    /// Synchronous mapping: user-space cache-line write-back + fence.
    CacheLine(FlushInstr),
    /// Page-cache mapping: msync of the flushed page ranges at each fence.
    Msync,
    /// Anonymous memory: nothing is durable beyond the process.
    Memory,
}

impl std::fmt::Display for PersistMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PersistMode::CacheLine(i) => write!(f, "cacheline-{}+sfence", i.name()),
            PersistMode::Msync => f.write_str("msync"),
            PersistMode::Memory => f.write_str("memory"),
        }
    }
}

/// What the caller asks for when opening a region.
#[derive(Debug, Clone, Default)]
pub struct OpenParams {
    /// Create (or grow) the file to this size when it does not have it.
    pub create_size: Option<u64>,
    /// Map privately (copy-on-write): stores never reach the file. Used by read-only
    /// checks that still need to replay the log in memory.
    pub private: bool,
    /// Force a persistence mode instead of detecting it (e.g. cache-line flushes on
    /// /dev/shm to measure what real PM would cost). `Memory` is not accepted here.
    pub force_mode: Option<PersistMode>,
    /// Advisory lock (flock) taken on the file for as long as the region is open, so two
    /// processes cannot both own one volume. Refused at once (never waits) when held.
    pub lock: LockMode,
}

/// The `flock` an open takes: `Exclusive` for the one writer, `Shared` for readers
/// (which then cannot run beside a writer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LockMode {
    #[default]
    None,
    Shared,
    Exclusive,
}

enum Backing {
    Mapped {
        _file: File,
        /// (device, inode) of the file when the mapping is shared (stores reach it).
        shared_id: Option<(u64, u64)>,
    },
    Anon,
}

/// A mapped region. Shared between threads; the owner (the volume) guarantees that no
/// byte range is written while another thread reads it.
pub struct Region {
    base: *mut u8,
    len: usize,
    mode: PersistMode,
    path: Option<PathBuf>,
    _backing: Backing,
    msync_pending: Mutex<Vec<(usize, usize)>>,
    /// Fast check on the store path; the recorder itself is behind the mutex.
    recording: std::sync::atomic::AtomicBool,
    recorder: Mutex<Option<Recorder>>,
    /// Test-only fault: fences left before one reports a persistence failure.
    fence_fault: std::sync::atomic::AtomicI64,
    /// The mapping, unmapped when its last holder lets go: this region, or a
    /// `Prefaulter` in the middle of a step (closing never waits for one).
    map: std::sync::Arc<MapLease>,
}

/// A mapping made at open, unmapped on drop.
struct MapLease {
    base: *mut u8,
    map_len: usize,
}

// SAFETY: the lease only unmaps, once, when the last holder drops it; the bytes are
// accessed through the region's discipline.
unsafe impl Send for MapLease {}
// SAFETY: as above; shared references to the lease touch nothing.
unsafe impl Sync for MapLease {}

impl Drop for MapLease {
    fn drop(&mut self) {
        // SAFETY: `base`/`map_len` describe the mapping created at open; its region
        // (whose borrows end with it) and every prefaulter's step are over, since this
        // is the last holder.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
    }
}

// SAFETY: the region is plain memory; all mutation goes through raw pointers under the
// owner's discipline (exclusive ranges), and internal bookkeeping is behind mutexes.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only hands out access under that discipline.
unsafe impl Sync for Region {}

impl Region {
    /// Open (or create) a region on a path: a regular file (e.g. in /dev/shm) or /dev/dax*.
    pub fn open(path: &Path, params: &OpenParams) -> Result<Region> {
        let io = |source| PmemError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut oo = OpenOptions::new();
        oo.read(true)
            .write(!params.private || params.create_size.is_some());
        if params.create_size.is_some() {
            oo.create(true);
        }
        oo.custom_flags(libc::O_CLOEXEC);
        let file = oo.open(path).map_err(io)?;
        let op = match params.lock {
            LockMode::None => None,
            LockMode::Shared => Some(libc::LOCK_SH),
            LockMode::Exclusive => Some(libc::LOCK_EX),
        };
        if let Some(op) = op {
            if let Err(e) = flock_retrying(&file, op) {
                return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    PmemError::Locked {
                        path: path.to_path_buf(),
                    }
                } else {
                    io(e)
                });
            }
        }
        let meta = file.metadata().map_err(io)?;
        let is_dax = meta.file_type().is_char_device();
        if !is_dax && !meta.file_type().is_file() {
            return Err(PmemError::NotRegion {
                path: path.to_path_buf(),
            });
        }
        let mut size = if is_dax {
            dax_size(path, &meta).map_err(io)?
        } else {
            meta.len()
        };
        if let Some(want) = params.create_size {
            if !is_dax && size < want {
                file.set_len(want).map_err(io)?;
                size = want;
            }
        }
        if size < 2 * PAGE as u64 || size % PAGE as u64 != 0 || size > usize::MAX as u64 {
            return Err(PmemError::BadSize {
                path: path.to_path_buf(),
                size,
            });
        }
        let len = size as usize;
        let fd = file.as_raw_fd();
        // Private maps of a read-only fd still allow writes to the private copy.
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let (base, detected) = if params.private {
            (
                mmap(len, prot, libc::MAP_PRIVATE, fd).map_err(io)?,
                PersistMode::Memory,
            )
        } else {
            // Try a synchronous mapping first: it succeeds only on DAX, where cache-line
            // write-back is durability.
            match mmap(len, prot, libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC, fd) {
                Ok(p) => (p, PersistMode::CacheLine(FlushInstr::detect())),
                Err(_) => (
                    mmap(len, prot, libc::MAP_SHARED, fd).map_err(io)?,
                    PersistMode::Msync,
                ),
            }
        };
        let mode = match params.force_mode {
            None => detected,
            Some(PersistMode::Memory) => {
                return Err(PmemError::ModeUnavailable(PersistMode::Memory))
            }
            Some(PersistMode::CacheLine(i)) => {
                if !i.available() {
                    return Err(PmemError::ModeUnavailable(PersistMode::CacheLine(i)));
                }
                PersistMode::CacheLine(i)
            }
            Some(PersistMode::Msync) => PersistMode::Msync,
        };
        tracing::debug!(path = %path.display(), len, %mode, "mapped region");
        let shared_id = match (params.private, file.metadata()) {
            (false, Ok(m)) => {
                use std::os::unix::fs::MetadataExt;
                Some((m.dev(), m.ino()))
            }
            _ => None,
        };
        Ok(Region {
            base,
            len,
            mode,
            path: Some(path.to_path_buf()),
            _backing: Backing::Mapped {
                _file: file,
                shared_id,
            },
            msync_pending: Mutex::new(Vec::new()),
            recording: false.into(),
            recorder: Mutex::new(None),
            fence_fault: (-1).into(),
            map: std::sync::Arc::new(MapLease { base, map_len: len }),
        })
    }

    /// An anonymous region holding a copy of `image` (tests, fuzzing, crash images).
    /// The (device, inode) of the file this region maps shared from its start, if it
    /// does: another shared mapping of that file sees the same bytes (the server's
    /// layer-2 receive memory, into which the kernel lands writes).
    pub fn shared_file_id(&self) -> Option<(u64, u64)> {
        match &self._backing {
            Backing::Mapped { shared_id, .. } => *shared_id,
            Backing::Anon => None,
        }
    }

    pub fn from_image(image: &[u8]) -> Region {
        let len = image.len().max(1).div_ceil(PAGE) * PAGE;
        let base = mmap(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
        )
        .expect("anonymous mmap failed: out of memory");
        // SAFETY: `base` is a fresh private mapping of `len >= image.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), base, image.len()) };
        Region {
            base,
            len: image.len(),
            mode: PersistMode::Memory,
            path: None,
            _backing: Backing::Anon,
            msync_pending: Mutex::new(Vec::new()),
            recording: false.into(),
            recorder: Mutex::new(None),
            fence_fault: (-1).into(),
            map: std::sync::Arc::new(MapLease { base, map_len: len }),
        }
    }

    /// An anonymous zero-filled region of `len` bytes.
    pub fn anonymous(len: usize) -> Region {
        Region::from_image(&vec![0u8; len])
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn mode(&self) -> PersistMode {
        self.mode
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Start logging every store, flush and fence (crash testing). The current contents
    /// become the recording's base image.
    ///
    /// # Safety
    /// No other thread may use the region while recording (each flush compares the
    /// whole mapping with the recording's shadow copy).
    pub unsafe fn start_recording(&self) {
        // SAFETY: the caller's contract: nobody stores meanwhile.
        let base = unsafe { self.slice(0, self.len) }.to_vec();
        *self.recorder.lock().unwrap() = Some(Recorder::new(base));
        self.recording
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Stop recording and return what was recorded.
    pub fn take_recording(&self) -> Option<Recording> {
        self.recording
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.recorder.lock().unwrap().take().map(Recorder::finish)
    }

    /// Put a marker into the recording (operation boundaries for the crash oracle).
    pub fn mark(&self, tag: u64) {
        self.with_recorder(|r| r.mark(tag));
    }

    pub fn is_recording(&self) -> bool {
        self.recording.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn with_recorder(&self, f: impl FnOnce(&mut Recorder)) {
        if self.is_recording() {
            if let Some(r) = self.recorder.lock().unwrap().as_mut() {
                f(r);
            }
        }
    }

    /// The file descriptor of a file-backed shared mapping (for page attachment).
    pub fn shared_fd(&self) -> Option<std::os::unix::io::RawFd> {
        match &self._backing {
            Backing::Mapped { _file, .. } if self.mode != PersistMode::Memory => {
                Some(_file.as_raw_fd())
            }
            _ => None,
        }
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "pmem access out of range: {off}+{len} > {}",
            self.len
        );
    }

    /// Borrow bytes of the region.
    ///
    /// # Safety
    /// The access contract: no other thread writes `[off, off+len)` while the slice lives.
    pub unsafe fn slice(&self, off: usize, len: usize) -> &[u8] {
        self.check(off, len);
        // SAFETY: in range (checked); the caller guarantees no concurrent writer.
        std::slice::from_raw_parts(self.base.add(off), len)
    }

    /// Borrow bytes of the region mutably, for zero-copy fills. Stores made through the
    /// slice are seen by the recorder at the next `flush` of the range.
    ///
    /// # Safety
    /// The access contract: the caller is alone with `[off, off+len)` while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, off: usize, len: usize) -> &mut [u8] {
        self.check(off, len);
        // SAFETY: in range; exclusivity is the caller's contract.
        std::slice::from_raw_parts_mut(self.base.add(off), len)
    }

    /// The whole mapping, for an owner that holds the region alone (`&mut`: no store
    /// or borrow can run beside it), e.g. while recovering before the volume is shared.
    pub fn bytes(&mut self) -> &[u8] {
        // SAFETY: `&mut self` excludes every other access through this region.
        unsafe { self.slice(0, self.len) }
    }

    /// Store bytes as the region's only user (see `bytes`).
    pub fn store(&mut self, off: usize, data: &[u8]) {
        // SAFETY: `&mut self` makes the caller alone with every range.
        unsafe { self.write(off, data) }
    }

    /// Store zeros as the region's only user (see `bytes`).
    pub fn store_zero(&mut self, off: usize, len: usize) {
        // SAFETY: as in `store`.
        unsafe { self.zero(off, len) }
    }

    /// Store bytes (ordinary stores; durable after `flush` + `fence`).
    ///
    /// # Safety
    /// The access contract (see the crate docs): the caller is alone with the range.
    pub unsafe fn write(&self, off: usize, data: &[u8]) {
        self.check(off, data.len());
        // SAFETY: in range (checked); the caller is alone with the destination.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(off), data.len()) };
        self.with_recorder(|r| r.store(off, data));
    }

    /// Store `len` zero bytes.
    ///
    /// # Safety
    /// The access contract: the caller is alone with the range.
    pub unsafe fn zero(&self, off: usize, len: usize) {
        self.check(off, len);
        // SAFETY: in range (checked); the caller is alone with the destination.
        unsafe { std::ptr::write_bytes(self.base.add(off), 0, len) };
        self.with_recorder(|r| r.store(off, &vec![0u8; len]));
    }

    /// One aligned 8-byte store: atomic with respect to power failure. Concurrent
    /// readers of the word see the old or the new value (it is an atomic store), so
    /// this one needs no exclusivity.
    pub fn write_u64(&self, off: usize, v: u64) {
        assert_eq!(off % 8, 0, "unaligned atomic store");
        self.check(off, 8);
        // SAFETY: in range and 8-byte aligned (the mapping is page aligned).
        unsafe {
            (*(self.base.add(off) as *const std::sync::atomic::AtomicU64))
                .store(v, std::sync::atomic::Ordering::Release)
        };
        self.with_recorder(|r| r.store(off, &v.to_le_bytes()));
    }

    pub fn read_u64(&self, off: usize) -> u64 {
        assert_eq!(off % 8, 0);
        self.check(off, 8);
        // SAFETY: in range, aligned; an atomic load tolerates a concurrent aligned store.
        unsafe {
            (*(self.base.add(off) as *const std::sync::atomic::AtomicU64))
                .load(std::sync::atomic::Ordering::Acquire)
        }
    }

    /// Copy a large buffer into the region, bypassing the cache where the mapping is
    /// synchronous (non-temporal stores need no later write-back, only the fence).
    /// Elsewhere it is an ordinary copy followed by `flush`.
    ///
    /// # Safety
    /// The access contract: the caller is alone with the range.
    pub unsafe fn copy_persist(&self, off: usize, data: &[u8]) {
        self.check(off, data.len());
        match self.mode {
            PersistMode::CacheLine(_) if data.len() >= 1024 && !self.is_recording() => {
                // SAFETY: in range (checked); the caller is alone with the destination.
                unsafe { flush::copy_nontemporal(self.base.add(off), data) };
            }
            _ => {
                // SAFETY: as above.
                unsafe { self.write(off, data) };
                self.flush(off, data.len());
            }
        }
    }

    /// Write back the cache lines of a range (not yet ordered: see `fence`).
    pub fn flush(&self, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        self.check(off, len);
        // SAFETY: reading our own mapping; writers of this range are the caller itself.
        self.with_recorder(|r| r.flush(unsafe { self.slice(0, self.len) }, off, len));
        match self.mode {
            PersistMode::CacheLine(instr) => {
                // SAFETY: the range is inside the mapping (checked above).
                unsafe { flush::flush_range(instr, self.base.add(off), len) }
            }
            PersistMode::Msync => {
                let start = off / PAGE * PAGE;
                let end = (off + len).div_ceil(PAGE) * PAGE;
                let mut p = self.msync_pending.lock().unwrap();
                if let Some(last) = p.last_mut() {
                    if start <= last.1 && end >= last.0 {
                        last.0 = last.0.min(start);
                        last.1 = last.1.max(end);
                        return;
                    }
                }
                p.push((start, end));
            }
            PersistMode::Memory => {}
        }
    }

    /// Ordering point: everything flushed before is durable after. An error (msync
    /// failing on a file-backed mapping) means the flushed ranges may not be durable;
    /// the caller must stop relying on them.
    pub fn fence(&self) -> Result<()> {
        self.with_recorder(|r| r.fence());
        let injected = self
            .fence_fault
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| (n > 0).then(|| n - 1),
            )
            .is_ok_and(|n| n == 1);
        match self.mode {
            PersistMode::CacheLine(_) => flush::sfence(),
            PersistMode::Msync => {
                let ranges = merge_ranges(std::mem::take(&mut *self.msync_pending.lock().unwrap()));
                let mut first_err = None;
                for (s, e) in ranges {
                    // SAFETY: page-aligned subrange of our own mapping.
                    let rc = unsafe {
                        libc::msync(self.base.add(s) as *mut libc::c_void, e - s, libc::MS_SYNC)
                    };
                    if rc != 0 && first_err.is_none() {
                        first_err = Some(std::io::Error::last_os_error());
                    }
                }
                if let Some(source) = first_err {
                    return Err(self.persist_error(source));
                }
            }
            PersistMode::Memory => std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst),
        }
        if injected {
            return Err(self.persist_error(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        Ok(())
    }

    fn persist_error(&self, source: std::io::Error) -> PmemError {
        PmemError::Persist {
            path: self
                .path
                .clone()
                .unwrap_or_else(|| PathBuf::from("(memory)")),
            source,
        }
    }

    /// Test hook: the `n`th fence from now (1 = the next) reports a persistence failure
    /// (EIO), as msync does after a write-back error; 0 clears the hook.
    #[doc(hidden)]
    pub fn inject_fence_failure(&self, n: i64) {
        self.fence_fault.store(
            if n == 0 { -1 } else { n },
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// Ask the kernel to back `[off, off+len)` with writable pages now, so the first
    /// stores there do not fault (used for the log ring). Best effort.
    pub fn prefault(&self, off: usize, len: usize) {
        self.check(off, len);
        if self.mode == PersistMode::Memory {
            return;
        }
        let start = off / PAGE * PAGE;
        let end = (off + len).div_ceil(PAGE) * PAGE;
        // SAFETY: a page-aligned subrange of our own mapping; populating does not
        // change its contents.
        let rc = unsafe {
            libc::madvise(
                self.base.add(start) as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc != 0 {
            tracing::debug!(err = %std::io::Error::last_os_error(), "prefault not available");
        }
    }

    /// Whether faulting this region's pages in ahead of use costs nothing but page
    /// tables (and can fail no way a later store could not): a DAX device, or a
    /// [`populating_is_free`] file. Not an anonymous or private region. The persistence
    /// mode says nothing here: cache-line flushes can be forced on any file (review 26b:
    /// a forced `clwb` on a sparse tmpfs image had holes filled, and SIGBUS on a full
    /// tmpfs).
    pub fn populating_is_free(&self) -> bool {
        use std::os::fd::AsFd;
        use std::os::unix::fs::FileTypeExt;
        match (&self._backing, self.mode) {
            (_, PersistMode::Memory) | (Backing::Anon, _) => false,
            (Backing::Mapped { _file, .. }, _) => {
                _file
                    .metadata()
                    .is_ok_and(|m| m.file_type().is_char_device())
                    || populating_is_free(_file.as_fd())
            }
        }
    }

    /// A handle that populates pages of this region from another thread for as long
    /// as the region is mapped (`Prefaulter::populate`).
    pub fn prefaulter(&self) -> Prefaulter {
        Prefaulter {
            base: self.base as usize,
            len: self.len,
            memory: self.mode == PersistMode::Memory,
            map: std::sync::Arc::downgrade(&self.map),
        }
    }

    /// `flush` then `fence`.
    pub fn persist(&self, off: usize, len: usize) -> Result<()> {
        self.flush(off, len);
        self.fence()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // A prefaulter may be in the middle of a step, holding the mapping (`map`): it
        // is unmapped when that step ends, which under load may be long after. The
        // image must not stay mapped that long (the mapping keeps the file open, and so
        // its lock: opening the volume again would find it busy), so anonymous memory
        // takes the range's place now, at the same address: a step still running
        // touches that, not the file, and the last holder unmaps it.
        if std::sync::Arc::weak_count(&self.map) > 0 {
            // SAFETY: the range is exactly this region's mapping, which this process
            // owns; the region's borrows ended with it; a prefaulter in a step only
            // stores (a swap of a byte with itself) into whatever is mapped there.
            let p = unsafe {
                libc::mmap(
                    self.map.base as *mut libc::c_void,
                    self.map.map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                let err = std::io::Error::last_os_error();
                tracing::warn!(%err, "image stays mapped until the prefault step ends");
            }
        }
    }
}

/// How long a refused `flock` is tried again before the file counts as held: in a
/// multithreaded process, a child that another thread forked holds a copy of every
/// descriptor, and the lock with it, until it execs (O_CLOEXEC closes them only then),
/// so a lock just given back can look held for a moment (seen: a volume opened right
/// after its mkfs while a test's other thread started a command).
pub const LOCK_RETRY_WINDOW: std::time::Duration = std::time::Duration::from_millis(200);
/// The pause between tries within [`LOCK_RETRY_WINDOW`].
const LOCK_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

/// `flock(file, op | LOCK_NB)`, tried again for up to [`LOCK_RETRY_WINDOW`] while it is
/// refused with EWOULDBLOCK (then that error); any other error at once.
pub fn flock_retrying(file: &File, op: libc::c_int) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + LOCK_RETRY_WINDOW;
    loop {
        // SAFETY: flock on a file descriptor the caller owns; no pointers involved.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) || std::time::Instant::now() >= deadline {
            return Err(e);
        }
        std::thread::sleep(LOCK_RETRY_PAUSE);
    }
}

/// Whether populating pages of the file `fd` ahead of use costs nothing but page
/// tables: a file in tmpfs (/dev/shm) with storage for every byte. Not a sparse file
/// (populating would take memory for every hole) nor one on a disk file system
/// (populating writable pages dirties them for writeback). DAX devices are the
/// caller's to decide.
pub fn populating_is_free(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: stat and statfs are plain integers, for which all zero bytes are valid.
    let (mut st, mut fs): (libc::stat, libc::statfs) = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor the caller keeps open and structs the calls fill in.
    let ok = unsafe {
        libc::fstat(fd.as_raw_fd(), &mut st) == 0 && libc::fstatfs(fd.as_raw_fd(), &mut fs) == 0
    };
    ok && fs.f_type == libc::TMPFS_MAGIC
        && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
        && (st.st_blocks as u64).saturating_mul(512) >= st.st_size as u64
}

/// Give the calling thread only CPU time nothing else wants (SCHED_IDLE), for
/// background work such as prefaulting: any runnable thread of normal priority
/// preempts it at once. At nice 19 instead, a prefault thread held the CPU a request
/// thread had just been woken on for up to a scheduler slice (a same-host client's
/// close took 0.5-0.8 ms instead of 0.2-0.3 while two such threads ran). Falls back to nice 19
/// where SCHED_IDLE is refused.
pub fn run_this_thread_when_idle() {
    // SAFETY: sched_param is a plain integer struct; all zero is valid (priority 0,
    // the only one SCHED_IDLE takes).
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 names the calling thread; the call reads `param` only.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        // SAFETY: setpriority on this thread (who 0 = the calling thread on Linux)
        // with plain integers; no memory is passed.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
    }
}

/// Fault the pages of `[ptr, ptr+len)` in writable from this thread, one store fault
/// per 4 KiB page: a compare-and-swap of the page's first byte with itself, which
/// leaves every byte as it is whatever other threads or processes store there meanwhile
/// (a locked read-modify-write that writes back what it read, or fails because another
/// store came first). Not an add of zero: the compiler turns that into a load, and a
/// load faults the page in read-only (tmpfs then maps no page at a hole at all).
/// Unlike MADV_POPULATE_WRITE this holds no lock of the process's address space between
/// pages: a low-priority thread preempted in the middle of a populate kept every mmap,
/// munmap and thread creation of its process waiting (up to 0.7 s with every CPU busy;
/// review 26). A fault takes only its VMA's lock.
///
/// # Safety
/// `[ptr, ptr+len)` lies inside a shared, writable mapping that stays mapped for the
/// call, `ptr` page-aligned.
pub unsafe fn touch_writable(ptr: *mut u8, len: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: inside the mapping the caller vouches for; the memory is shared (with
        // other processes too), so it is reached only through raw pointers and atomics,
        // and swapping a byte for itself changes nothing.
        let byte = unsafe { std::sync::atomic::AtomicU8::from_ptr(ptr.add(off)) };
        let seen = byte.load(std::sync::atomic::Ordering::Relaxed);
        let _ = byte.compare_exchange(
            seen,
            seen,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
        off += PAGE;
    }
}

/// Populates pages of a region from another thread (see [`Region::prefaulter`]).
pub struct Prefaulter {
    base: usize,
    len: usize,
    memory: bool,
    map: std::sync::Weak<MapLease>,
}

impl Prefaulter {
    /// Whether the region is still mapped.
    pub fn live(&self) -> bool {
        self.map.strong_count() > 0
    }

    /// Back `[off, off+len)` (clamped to the region) with writable pages
    /// ([`touch_writable`]). False once the region is gone (nothing done). The mapping
    /// stays while a step runs: a region dropped meanwhile is unmapped when it ends.
    pub fn populate(&self, off: usize, len: usize) -> bool {
        let Some(_mapped) = self.map.upgrade() else {
            return false;
        };
        if self.memory || off >= self.len || len == 0 {
            return true;
        }
        let start = off / PAGE * PAGE;
        let end = (off + len.min(self.len - off)).div_ceil(PAGE) * PAGE;
        let end = end.min(self.len.div_ceil(PAGE) * PAGE);
        // SAFETY: `_mapped` keeps the shared writable mapping (a file region: `memory`
        // is false) mapped for the call; the range is page-aligned and inside it.
        unsafe { touch_writable((self.base + start) as *mut u8, end - start) };
        true
    }
}

/// Sort page ranges and merge those that overlap or lie at most [`MSYNC_MERGE_GAP`]
/// apart: every byte of the input is covered by exactly one output range.
fn merge_ranges(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match out.last_mut() {
            Some(last) if s <= last.1.saturating_add(MSYNC_MERGE_GAP) => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

fn mmap(len: usize, prot: i32, flags: i32, fd: i32) -> std::io::Result<*mut u8> {
    // SAFETY: a fresh mapping at an address the kernel chooses; arguments are plain values.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(p as *mut u8)
    }
}

fn dax_size(path: &Path, meta: &std::fs::Metadata) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let sys = format!("/sys/dev/char/{major}:{minor}/size");
    let s = std::fs::read_to_string(&sys).map_err(|e| {
        std::io::Error::new(e.kind(), format!("{}: reading {sys}: {e}", path.display()))
    })?;
    s.trim().parse().map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad size in {sys}"),
        )
    })
}

#[cfg(test)]
mod tests {
    /// Minor faults of this thread so far.
    fn minor_faults() -> i64 {
        // SAFETY: rusage is plain integers; RUSAGE_THREAD fills it for this thread.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) };
        r.ru_minflt
    }

    /// `touch_writable` leaves pages mapped writable (stores after it take no fault),
    /// gives a hole of a shared file its page, and changes no byte.
    #[test]
    fn touched_pages_take_stores_without_a_fault_and_keep_their_bytes() {
        use std::os::unix::io::AsRawFd;
        const PAGES: usize = 64;
        let path = format!("/dev/shm/zcfs-pmem-touch-{}", std::process::id());
        let fd = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        fd.set_len((PAGES * PAGE) as u64).unwrap();
        let p = mmap(
            PAGES * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
        )
        .unwrap();
        // SAFETY: inside the fresh mapping, which nothing else uses.
        unsafe { p.add(5 * PAGE + 1).write(9) };
        // SAFETY: a page-aligned shared writable mapping of PAGES pages, mapped for the call.
        unsafe { super::touch_writable(p, PAGES * PAGE) };
        // Every hole got its page from the touch itself (a load would have mapped none).
        use std::os::unix::fs::MetadataExt;
        assert_eq!(fd.metadata().unwrap().blocks() as usize * 512, PAGES * PAGE);
        let before = minor_faults();
        for i in 0..PAGES {
            // SAFETY: inside the mapping.
            unsafe { p.add(i * PAGE + 2).write(1) };
        }
        assert_eq!(minor_faults() - before, 0, "stores after the touch faulted");
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { p.add(5 * PAGE + 1).read() }, 9);
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { p.read() }, 0);
        // SAFETY: unmapping what was mapped above.
        unsafe { libc::munmap(p as *mut libc::c_void, PAGES * PAGE) };
    }

    /// Populating is free only for a regular tmpfs file with storage for every byte.
    #[test]
    fn populating_is_free_only_for_an_allocated_tmpfs_file() {
        use std::os::fd::AsFd;
        use std::os::unix::io::AsRawFd;
        let allocate = |f: &std::fs::File, n: i64| {
            // SAFETY: fallocate on a descriptor we own, plain integers.
            assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, n) }, 0);
        };
        let shm = format!("/dev/shm/zcfs-pmem-free-{}", std::process::id());
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&shm)
            .unwrap();
        f.set_len(1 << 20).unwrap();
        assert!(!super::populating_is_free(f.as_fd()), "sparse");
        allocate(&f, (1 << 20) - 4096);
        assert!(!super::populating_is_free(f.as_fd()), "one page short");
        allocate(&f, 1 << 20);
        assert!(super::populating_is_free(f.as_fd()));
        std::fs::remove_file(&shm).unwrap();
        // The same on a disk file system (/tmp here; where /tmp is a tmpfs, the answer
        // is that of one).
        let disk = std::env::temp_dir().join(format!("zcfs-populate-test-{}", std::process::id()));
        let g = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&disk)
            .unwrap();
        g.set_len(1 << 20).unwrap();
        allocate(&g, 1 << 20);
        let on_tmpfs = {
            // SAFETY: statfs is plain integers; a descriptor we own.
            let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
            unsafe { libc::fstatfs(g.as_raw_fd(), &mut fs) };
            fs.f_type == libc::TMPFS_MAGIC
        };
        assert_eq!(
            super::populating_is_free(g.as_fd()),
            on_tmpfs,
            "a disk file"
        );
        std::fs::remove_file(&disk).unwrap();
        let dir = std::fs::File::open("/dev/shm").unwrap();
        assert!(!super::populating_is_free(dir.as_fd()), "a directory");
    }

    #[test]
    fn a_background_thread_runs_only_when_a_cpu_is_idle() {
        let policy = std::thread::spawn(|| {
            run_this_thread_when_idle();
            // SAFETY: pid 0 names the calling thread; no memory is passed.
            unsafe { libc::sched_getscheduler(0) }
        })
        .join()
        .unwrap();
        assert_eq!(policy, libc::SCHED_IDLE);
        // SAFETY: as above.
        assert_ne!(
            unsafe { libc::sched_getscheduler(0) },
            libc::SCHED_IDLE,
            "only that thread"
        );
    }

    use super::*;

    #[test]
    fn file_region_detects_msync_on_shm_and_persists() {
        let path = std::env::temp_dir().join(format!("zcfs-pmem-test-{}", std::process::id()));
        let r = Region::open(
            &path,
            &OpenParams {
                create_size: Some(1 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        // /tmp and /dev/shm are not DAX: MAP_SYNC must have been refused.
        assert_eq!(r.mode(), PersistMode::Msync);
        // SAFETY: single-threaded test; nobody else uses the region.
        unsafe { r.write(4096, b"hello") };
        r.write_u64(8192, 0xdead_beef);
        r.persist(4096, 5000).unwrap();
        drop(r);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[4096..4101], b"hello");
        assert_eq!(
            u64::from_le_bytes(bytes[8192..8200].try_into().unwrap()),
            0xdead_beef
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn forced_cacheline_mode_flushes_without_fault() {
        let path = std::env::temp_dir().join(format!("zcfs-pmem-cl-{}", std::process::id()));
        let instr = FlushInstr::detect();
        let r = Region::open(
            &path,
            &OpenParams {
                create_size: Some(1 << 20),
                force_mode: Some(PersistMode::CacheLine(instr)),
                ..Default::default()
            },
        )
        .unwrap();
        let big = vec![7u8; 200_000];
        // SAFETY: single-threaded test.
        unsafe { r.copy_persist(100, &big) };
        r.fence().unwrap();
        // SAFETY: single-threaded test.
        assert!(unsafe { r.slice(100, big.len()) }.iter().all(|&b| b == 7));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_second_exclusive_opener_is_refused_and_a_shared_one_too() {
        let path = std::env::temp_dir().join(format!("zcfs-pmem-lock-{}", std::process::id()));
        let p = |lock| OpenParams {
            create_size: Some(1 << 16),
            lock,
            ..Default::default()
        };
        let a = Region::open(&path, &p(LockMode::Exclusive)).unwrap();
        assert!(matches!(
            Region::open(&path, &p(LockMode::Exclusive)),
            Err(PmemError::Locked { .. })
        ));
        assert!(matches!(
            Region::open(&path, &p(LockMode::Shared)),
            Err(PmemError::Locked { .. })
        ));
        drop(a);
        let r1 = Region::open(&path, &p(LockMode::Shared)).unwrap();
        let r2 = Region::open(&path, &p(LockMode::Shared)).unwrap();
        assert!(matches!(
            Region::open(&path, &p(LockMode::Exclusive)),
            Err(PmemError::Locked { .. })
        ));
        drop((r1, r2));
        Region::open(&path, &p(LockMode::Exclusive)).unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    /// A lock given back within `LOCK_RETRY_WINDOW` is taken (a forked child's copy of
    /// the descriptor closing at its exec); one held past it is refused, after about
    /// the window.
    #[test]
    fn a_lock_given_back_within_the_retry_window_is_taken_and_one_held_past_it_is_not() {
        let path = std::env::temp_dir().join(format!("zcfs-pmem-lockwin-{}", std::process::id()));
        let p = |lock| OpenParams {
            create_size: Some(1 << 16),
            lock,
            ..Default::default()
        };
        let a = Region::open(&path, &p(LockMode::Exclusive)).unwrap();
        let t = std::time::Instant::now();
        assert!(matches!(
            Region::open(&path, &p(LockMode::Exclusive)),
            Err(PmemError::Locked { .. })
        ));
        assert!(t.elapsed() >= LOCK_RETRY_WINDOW, "{:?}", t.elapsed());
        let giver = std::thread::spawn(move || {
            std::thread::sleep(LOCK_RETRY_WINDOW / 4);
            drop(a);
        });
        Region::open(&path, &p(LockMode::Exclusive)).unwrap();
        giver.join().unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn an_injected_fence_failure_is_reported_once() {
        let r = Region::anonymous(8192);
        r.inject_fence_failure(2);
        assert!(r.fence().is_ok());
        assert!(matches!(r.fence(), Err(PmemError::Persist { .. })));
        assert!(r.fence().is_ok());
    }

    #[test]
    fn msync_ranges_merge_up_to_the_gap_bound_and_no_further() {
        let g = MSYNC_MERGE_GAP;
        // Out of order, overlapping, and exactly the bound apart: one range.
        assert_eq!(
            merge_ranges(vec![
                (3 * PAGE + g, 4 * PAGE + g),
                (0, 2 * PAGE),
                (PAGE, 3 * PAGE)
            ]),
            vec![(0, 4 * PAGE + g)]
        );
        // One page past the bound: two ranges.
        assert_eq!(
            merge_ranges(vec![(0, PAGE), (2 * PAGE + g, 3 * PAGE + g)]),
            vec![(0, PAGE), (2 * PAGE + g, 3 * PAGE + g)]
        );
        // A range inside another changes nothing; nothing in, nothing out.
        assert_eq!(
            merge_ranges(vec![(0, 8 * PAGE), (PAGE, 2 * PAGE)]),
            vec![(0, 8 * PAGE)]
        );
        assert!(merge_ranges(Vec::new()).is_empty());
    }

    #[test]
    fn bad_sizes_are_errors() {
        let path = std::env::temp_dir().join(format!("zcfs-pmem-bad-{}", std::process::id()));
        std::fs::write(&path, [0u8; 100]).unwrap();
        assert!(matches!(
            Region::open(&path, &OpenParams::default()),
            Err(PmemError::BadSize { .. })
        ));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            Region::open(Path::new("/nonexistent/x"), &OpenParams::default()),
            Err(PmemError::Io { .. })
        ));
    }

    #[test]
    fn private_mapping_never_reaches_the_file() {
        let path = std::env::temp_dir().join(format!("zcfs-pmem-priv-{}", std::process::id()));
        std::fs::write(&path, vec![1u8; 8192]).unwrap();
        let r = Region::open(
            &path,
            &OpenParams {
                private: true,
                ..Default::default()
            },
        )
        .unwrap();
        // SAFETY: single-threaded test.
        unsafe { r.write(0, &[9u8; 16]) };
        r.persist(0, 16).unwrap();
        drop(r);
        assert_eq!(std::fs::read(&path).unwrap()[0], 1);
        std::fs::remove_file(&path).unwrap();
    }
}
