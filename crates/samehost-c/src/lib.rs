//! libzcfs: the same-host interface's C ABI (issue 13; docs/samehost.md), `extern "C"`
//! functions over [`zcfs_samehost::client::Client`]. Header: `include/zcfs.h`.
//!
//! Conventions: a call returns 0 (or a count of bytes or entries) on success and a
//! negative errno on failure; [`zcfs_connect`] and [`zcfs_buffer_ptr`] return NULL and
//! set `errno`. Every pointer argument is checked for NULL (`-EINVAL`); a Rust panic
//! never crosses the boundary (it becomes `-EIO`). A handle is not thread-safe: use
//! one per thread, or lock around it.

#![allow(non_camel_case_types)]

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use zcfs_samehost::client::{Client, Error, Place, Reservation};
use zcfs_samehost::ring::{Cqe, Placement, Sqe};

/// A connection (opaque).
pub struct zcfs_client {
    c: Client,
    /// Completions `zcfs_wait` reaped beyond what the caller had room for.
    pending: VecDeque<Cqe>,
    /// Reservations not yet committed or given back: only these have writable pages
    /// (`zcfs_zcopy_page`), and only these can be committed or aborted.
    reservations: HashMap<u64, Reservation>,
}

/// A placement transaction collected by `zcfs_pflush_add` (opaque).
pub struct zcfs_pflush {
    placements: Vec<Placement>,
}

/// Most placements one transaction holds: each names its own reservation, and the
/// server lets a connection hold at most 1024 reservations at once (and take at most
/// 4096 placements in one COMMIT).
pub const ZCFS_PFLUSH_MAX: usize = 1024;
const _: () = assert!(ZCFS_PFLUSH_MAX == zcfs_samehost::client::MAX_PLACEMENTS_PER_COMMIT);
/// `new_size` of `zcfs_pflush_add`: the file grows to the end of the last page.
pub const ZCFS_NO_NEW_SIZE: u64 = 0xFFFF_FFFF_FFFF_FFFF;
const _: () = assert!(ZCFS_NO_NEW_SIZE == zcfs_samehost::ring::NO_NEW_SIZE);
/// Most pages one `zcfs_zcopy_from` reserves.
pub const ZCFS_RESERVE_MAX: usize = 32768;
const _: () = assert!(ZCFS_RESERVE_MAX == zcfs_samehost::client::MAX_RESERVE_PER_CALL);
/// `zcfs_forget_mapped`'s "every file".
pub const ZCFS_ALL_FILES: u32 = 0xFFFF_FFFF;

/// Operation codes of a [`zcfs_sqe`].
pub const ZCFS_OP_NOP: u8 = 0;
pub const ZCFS_OP_READ: u8 = 1;
pub const ZCFS_OP_WRITE: u8 = 2;
pub const ZCFS_OP_FSYNC: u8 = 3;
pub const ZCFS_OP_PFREE: u8 = 8;
const _: () = {
    use zcfs_samehost::ring::op;
    assert!(ZCFS_OP_NOP == op::NOP && ZCFS_OP_READ == op::READ && ZCFS_OP_WRITE == op::WRITE);
    assert!(ZCFS_OP_FSYNC == op::FSYNC && ZCFS_OP_PFREE == op::PFREE);
};

/// A submission entry (as the ring's, 64 bytes): `op` on `handle` at `offset` for
/// `len` bytes, into or from buffer `buf` at `buf_off`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcfs_sqe {
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

/// A completion: `result` is bytes (or a count) done, or a negative errno.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct zcfs_cqe {
    pub user_data: u64,
    pub result: i64,
    pub extra: u64,
    pub extra2: u64,
}

/// `len` bytes of the file from `file_offset` are at `data` (in the read-only direct
/// map, valid until `zcfs_zcopy_release`), or a hole (`data` NULL, reads as zeros).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct zcfs_extent {
    pub file_offset: u64,
    pub len: u64,
    pub data: *const u8,
}

const _: () = assert!(std::mem::size_of::<zcfs_sqe>() == std::mem::size_of::<Sqe>());

impl From<zcfs_sqe> for Sqe {
    fn from(s: zcfs_sqe) -> Sqe {
        Sqe {
            user_data: s.user_data,
            op: s.op,
            flags: s.flags,
            reserved: s.reserved,
            handle: s.handle,
            offset: s.offset,
            len: s.len,
            buf: s.buf,
            reserved2: s.reserved2,
            buf_off: s.buf_off,
            aux: s.aux,
            aux2: s.aux2,
        }
    }
}

impl From<Cqe> for zcfs_cqe {
    fn from(c: Cqe) -> zcfs_cqe {
        zcfs_cqe {
            user_data: c.user_data,
            result: c.result,
            extra: c.extra,
            extra2: c.extra2,
        }
    }
}

fn neg(e: &Error) -> i64 {
    -(e.errno() as i64)
}

/// Run `f`, turning a panic into -EIO.
fn guard(f: impl FnOnce() -> i64) -> i64 {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-(libc::EIO as i64))
}

fn guard_int(f: impl FnOnce() -> i64) -> c_int {
    guard(f) as c_int
}

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno, always valid to write.
    unsafe { *libc::__errno_location() = e };
}

const EINVAL: i64 = -(libc::EINVAL as i64);

/// The client behind a handle, or -EINVAL for NULL.
///
/// # Safety
/// `h` is NULL or a handle from `zcfs_connect` not yet disconnected, used by one
/// thread at a time.
unsafe fn client<'a>(h: *mut zcfs_client) -> Result<&'a mut zcfs_client, i64> {
    // SAFETY: per the contract, a non-NULL `h` points to a live, unaliased zcfs_client.
    unsafe { h.as_mut() }.ok_or(EINVAL)
}

macro_rules! try_ffi {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return e,
        }
    };
}

/// The value of a library call, or return its error as a negative errno.
macro_rules! try_neg {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return neg(&e),
        }
    };
}

/// Connect to the same-host socket at `path` (a NUL-terminated path). Returns NULL and
/// sets errno on failure.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn zcfs_connect(path: *const c_char) -> *mut zcfs_client {
    if path.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: non-NULL and NUL-terminated per the contract.
    let p = unsafe { CStr::from_ptr(path) };
    let p = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(p.to_bytes());
    match catch_unwind(|| Client::connect(p)) {
        Ok(Ok(c)) => Box::into_raw(Box::new(zcfs_client {
            c,
            pending: VecDeque::new(),
            reservations: HashMap::new(),
        })),
        Ok(Err(e)) => {
            set_errno(e.errno());
            std::ptr::null_mut()
        }
        Err(_) => {
            set_errno(libc::EIO);
            std::ptr::null_mut()
        }
    }
}

/// Close the connection: the server releases its leases, reservations and open files.
/// NULL is ignored.
///
/// # Safety
/// `h` is NULL or a handle from `zcfs_connect`, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn zcfs_disconnect(h: *mut zcfs_client) {
    if h.is_null() {
        return;
    }
    // SAFETY: `h` came from Box::into_raw in zcfs_connect and is given up here.
    let b = unsafe { Box::from_raw(h) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(b)));
}

/// Whether the server grants this connection the direct map (1) or not (0); -EINVAL
/// for NULL.
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_trusted(h: *mut zcfs_client) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        h.c.trusted() as i64
    })
}

/// Direct map (trusted applications): fault the image's data area into this process's
/// writable mapping now, from the calling thread, so that no `zcfs_zcopy_from` fill
/// takes a page fault later: a setup cost paid once (~1 µs per 4 KiB page here).
/// Returns 1 when done, 0 when populating is not known to be free there (an image with
/// holes, on a disk file system, or a DAX device: nothing done), or a negative errno
/// (-EPERM without the direct map).
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_prefault(h: *mut zcfs_client) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        h.c.prefault_window()
            .map_or_else(|e| neg(&e), |done| done as i64)
    })
}

/// Make a shared buffer of `len` bytes; its id goes to `*out_id`.
///
/// # Safety
/// As [`client`]; `out_id` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn zcfs_register_buffer(
    h: *mut zcfs_client,
    len: usize,
    out_id: *mut u32,
) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        if out_id.is_null() || len == 0 {
            return EINVAL;
        }
        match h.c.register_buffer(len) {
            Ok(id) => {
                // SAFETY: non-NULL and writable per the contract.
                unsafe { out_id.write(id) };
                0
            }
            Err(e) => neg(&e),
        }
    })
}

/// The bytes of buffer `id` (valid until `zcfs_disconnect`); its length goes to
/// `*out_len` if that is not NULL. NULL and errno on failure.
///
/// # Safety
/// As [`client`]; `out_len` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn zcfs_buffer_ptr(
    h: *mut zcfs_client,
    id: u32,
    out_len: *mut usize,
) -> *mut u8 {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: per this function's contract.
        let h = unsafe { client(h) }.map_err(|_| libc::EINVAL)?;
        h.c.buffer_raw(id).map_err(|e| e.errno())
    }));
    match r {
        Ok(Ok((p, len))) => {
            if !out_len.is_null() {
                // SAFETY: non-NULL and writable per the contract.
                unsafe { out_len.write(len) };
            }
            p
        }
        Ok(Err(e)) => {
            set_errno(e);
            std::ptr::null_mut()
        }
        Err(_) => {
            set_errno(libc::EIO);
            std::ptr::null_mut()
        }
    }
}

/// Open (with O_CREAT, create) `path` in the volume; the file's handle goes to
/// `*out_handle`, its size to `*out_size` (if not NULL).
///
/// # Safety
/// As [`client`]; `path` NUL-terminated; `out_handle` writable; `out_size` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn zcfs_open(
    h: *mut zcfs_client,
    path: *const c_char,
    flags: c_int,
    mode: u32,
    out_handle: *mut u32,
    out_size: *mut u64,
) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        if path.is_null() || out_handle.is_null() {
            return EINVAL;
        }
        // SAFETY: non-NULL and NUL-terminated per the contract.
        let p = unsafe { CStr::from_ptr(path) }.to_bytes();
        match h.c.open(p, flags, mode) {
            Ok(f) => {
                // SAFETY: non-NULL and writable per the contract.
                unsafe { out_handle.write(f.handle) };
                if !out_size.is_null() {
                    // SAFETY: as above.
                    unsafe { out_size.write(f.size) };
                }
                0
            }
            Err(e) => neg(&e),
        }
    })
}

/// Close an open file.
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_close(h: *mut zcfs_client, file: u32) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        h.c.close(file).map_or_else(|e| neg(&e), |_| 0)
    })
}

/// Shared mode: read `len` bytes at `off` of `file` into buffer `buf_id` at
/// `buf_off`. Returns bytes read (short at the end of the file) or -errno.
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_read(
    h: *mut zcfs_client,
    file: u32,
    off: u64,
    buf_id: u32,
    buf_off: u64,
    len: u64,
) -> i64 {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        h.c.read(file, off, buf_id, buf_off, len)
            .map_or_else(|e| neg(&e), |n| n as i64)
    })
}

/// Shared mode: write `len` bytes from buffer `buf_id` at `buf_off` to `off` of
/// `file`. Returns bytes written or -errno.
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_write(
    h: *mut zcfs_client,
    file: u32,
    off: u64,
    buf_id: u32,
    buf_off: u64,
    len: u64,
) -> i64 {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        h.c.write(file, off, buf_id, buf_off, len)
            .map_or_else(|e| neg(&e), |n| n as i64)
    })
}

/// Make `file`'s data and metadata durable.
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_fsync(h: *mut zcfs_client, file: u32) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        h.c.fsync(file).map_or_else(|e| neg(&e), |_| 0)
    })
}

/// FLAC pfree: release the pages of `[off, off+len)` of `file` (a hole remains).
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_pfree(h: *mut zcfs_client, file: u32, off: u64, len: u64) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        h.c.pfree(file, off, len).map_or_else(|e| neg(&e), |_| 0)
    })
}

/// Put `n` entries on the submission ring (all or none: -EAGAIN when they do not
/// fit). A buffer range named by an entry must not be touched until its completion.
/// A `user_data` with bit 63 set is refused (-EINVAL): it names the library's own
/// synchronous calls. Other values may repeat.
///
/// # Safety
/// As [`client`]; `sqes` points to `n` entries (may be NULL when `n` is 0).
#[no_mangle]
pub unsafe extern "C" fn zcfs_submit(
    h: *mut zcfs_client,
    sqes: *const zcfs_sqe,
    n: usize,
) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        if n == 0 {
            return 0;
        }
        if sqes.is_null() || n > h.c.entries() as usize {
            return EINVAL;
        }
        // SAFETY: `sqes` points to `n` readable entries per the contract (n bounded by
        // the ring's entries above).
        let s = unsafe { std::slice::from_raw_parts(sqes, n) };
        let v: Vec<Sqe> = s.iter().map(|&e| e.into()).collect();
        h.c.submit(&v).map_or_else(|e| neg(&e), |_| 0)
    })
}

/// Wait until at least `min` completions are here (at most `cap`), and write up to
/// `cap` of them to `out`. Returns how many were written, or -errno (-EINVAL when
/// fewer than `min` are in flight or kept: they would never come). Completions
/// beyond `cap` are kept for the next call.
///
/// # Safety
/// As [`client`]; `out` points to room for `cap` entries.
#[no_mangle]
pub unsafe extern "C" fn zcfs_wait(
    h: *mut zcfs_client,
    min: usize,
    out: *mut zcfs_cqe,
    cap: usize,
) -> i64 {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        if out.is_null() || cap == 0 || min > cap {
            return EINVAL;
        }
        if h.pending.len() < min {
            let need = min - h.pending.len();
            match h.c.wait(need) {
                Ok(v) => h.pending.extend(v),
                Err(e) => return neg(&e),
            }
        } else {
            let mut v = Vec::new();
            h.c.reap(&mut v);
            h.pending.extend(v);
        }
        let n = cap.min(h.pending.len());
        for (i, c) in h.pending.drain(..n).enumerate() {
            // SAFETY: i < n <= cap, inside the caller's array.
            unsafe { out.add(i).write(c.into()) };
        }
        n as i64
    })
}

/// FLAC zero-copy read (direct map, trusted applications): lease the blocks of
/// `[off, off+len)` of `file` and describe them in `out` (up to `cap` extents), each
/// pointing into the read-only direct map. The extent count goes to `*out_n`, the
/// lease to `*out_lease`. Returns the bytes covered (short at the end of the file), or
/// -errno: -EPERM untrusted, -ENOBUFS when more than `cap` extents are needed (`*out_n`
/// says how many; nothing stays leased). The bytes stay as they are, whatever writers
/// do, until `zcfs_zcopy_release`.
///
/// # Safety
/// As [`client`]; `out` has room for `cap` extents; `out_n`, `out_lease` writable.
#[no_mangle]
pub unsafe extern "C" fn zcfs_zcopy_to(
    h: *mut zcfs_client,
    file: u32,
    off: u64,
    len: u64,
    out: *mut zcfs_extent,
    cap: usize,
    out_n: *mut usize,
    out_lease: *mut u64,
) -> i64 {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        if out.is_null() || out_n.is_null() || out_lease.is_null() {
            return EINVAL;
        }
        try_neg!(h.c.direct_map());
        let lv = try_neg!(h.c.read_extents(file, off, len));
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out_n.write(lv.extents.len()) };
        if lv.extents.len() > cap {
            let _ = h.c.release(lv.id);
            return -(libc::ENOBUFS as i64);
        }
        let map = h.c.mapped().expect("mapped above");
        let mut descs = Vec::with_capacity(lv.extents.len());
        for e in &lv.extents {
            let data = if e.is_hole() {
                std::ptr::null()
            } else {
                match map.bytes(e) {
                    Some(b) => b.as_ptr(),
                    None => {
                        let _ = h.c.release(lv.id);
                        return -(libc::EIO as i64);
                    }
                }
            };
            descs.push(zcfs_extent {
                file_offset: e.file_offset,
                len: e.len,
                data,
            });
        }
        for (i, d) in descs.into_iter().enumerate() {
            // SAFETY: i < extents <= cap, inside the caller's array.
            unsafe { out.add(i).write(d) };
        }
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out_lease.write(lv.id) };
        lv.bytes as i64
    })
}

/// Mapped read (direct map, trusted applications): `[off, off+len)` of `file` as
/// pieces in place in the read-only direct map, written to `out` (up to `cap`; a hole
/// has `data` NULL), their count to `*out_n`. The leases behind them are kept, so
/// reading the same chunks again asks the server nothing while the file is unchanged
/// (one load of its change counter). Returns the bytes covered (short at the end of the
/// file), or -errno: -EPERM untrusted, -ENOBUFS when more than `cap` pieces are needed
/// (`*out_n` says how many). The pointers stay valid until the next call on this
/// client (any `zcfs_*` function taking it): a later call may give the leases back.
///
/// # Safety
/// As [`client`]; `out` has room for `cap` entries; `out_n` writable.
#[no_mangle]
pub unsafe extern "C" fn zcfs_read_mapped(
    h: *mut zcfs_client,
    file: u32,
    off: u64,
    len: u64,
    out: *mut zcfs_extent,
    cap: usize,
    out_n: *mut usize,
) -> i64 {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        if out.is_null() || out_n.is_null() {
            return EINVAL;
        }
        try_neg!(h.c.direct_map());
        let pieces = try_neg!(h.c.read_mapped(file, off, len));
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out_n.write(pieces.len()) };
        if pieces.len() > cap {
            return -(libc::ENOBUFS as i64);
        }
        let mut at = off;
        for (i, p) in pieces.iter().enumerate() {
            let d = zcfs_extent {
                file_offset: at,
                len: p.len(),
                data: match p {
                    zcfs_samehost::client::Piece::Data(b) => b.as_ptr(),
                    zcfs_samehost::client::Piece::Hole(_) => std::ptr::null(),
                },
            };
            at += p.len();
            // SAFETY: i < pieces <= cap, inside the caller's array.
            unsafe { out.add(i).write(d) };
        }
        (at - off) as i64
    })
}

/// Give back the leases `zcfs_read_mapped` keeps: of `file`, or of every file when
/// `file` is `ZCFS_ALL_FILES` (UINT32_MAX). 0 or -errno.
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_forget_mapped(h: *mut zcfs_client, file: u32) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        let which = (file != ZCFS_ALL_FILES).then_some(file);
        h.c.forget_mapped(which).map_or_else(|e| neg(&e), |_| 0)
    })
}

/// End a lease of `zcfs_zcopy_to` (its pointers must not be used after).
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_zcopy_release(h: *mut zcfs_client, lease: u64) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        h.c.release(lease).map_or_else(|e| neg(&e), |_| 0)
    })
}

/// FLAC zero-copy write, first half (direct map, trusted applications): reserve
/// `pages` fresh zeroed 4 KiB blocks; the reservation id goes to `*out_id`. Fill page
/// `i` through `zcfs_zcopy_page`; `*out_data` (if not NULL) gets the whole window when
/// the blocks are adjacent, else NULL. Then place them with `zcfs_pflush_add` and
/// `zcfs_pflush_commit`, or give them back with `zcfs_zcopy_abort`.
///
/// The window's pointers (`*out_data` and every `zcfs_zcopy_page` of this id) may be
/// written only while the reservation is held: until `zcfs_pflush_commit` of a
/// transaction naming it (whatever it returns), `zcfs_zcopy_abort` of it, or
/// `zcfs_disconnect`. After that the blocks are a file's or free (and soon another
/// file's): a write through an old pointer changes file data in place, outside the
/// log. The library cannot catch it: the pointers stay mapped and writable (they are
/// views into one writable mapping of the image), only `zcfs_zcopy_page` of the id
/// returns NULL. Drop every copy of them when the reservation ends.
///
/// # Safety
/// As [`client`]; `out_id` writable; `out_data` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn zcfs_zcopy_from(
    h: *mut zcfs_client,
    pages: usize,
    out_id: *mut u64,
    out_data: *mut *mut u8,
) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        if out_id.is_null() || pages == 0 || pages > ZCFS_RESERVE_MAX {
            return EINVAL;
        }
        try_neg!(h.c.direct_map());
        let mut r = try_neg!(h.c.reserve(pages));
        let whole = r
            .window()
            .as_mut_slice()
            .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
        let id = r.id();
        h.reservations.insert(id, r);
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out_id.write(id) };
        if !out_data.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { out_data.write(whole) };
        }
        0
    })
}

/// Copy `len` bytes from `src` into the pages of reservation `id`, from byte `offset`
/// of the reservation on (page `offset / 4096` first), whether or not its pages are
/// adjacent in the image: one call, where filling a scattered reservation page by page
/// through `zcfs_zcopy_page` costs a call per 4 KiB (a checkpoint of 2 GiB from Python
/// filled at ~1 GB/s that way). Returns 0, or -EINVAL with nothing copied: no such
/// reservation (or it was committed or given back), `src` NULL with `len` > 0, or the
/// copy would go past the last page.
///
/// # Safety
/// As [`client`]; `src` readable for `len` bytes and not inside the reservation's pages.
#[no_mangle]
pub unsafe extern "C" fn zcfs_zcopy_fill(
    h: *mut zcfs_client,
    id: u64,
    offset: usize,
    src: *const u8,
    len: usize,
) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        if src.is_null() && len > 0 {
            return EINVAL;
        }
        let Some(r) = h.reservations.get_mut(&id) else {
            return EINVAL;
        };
        // Checked before the slice is made: no slice of more than the window's bytes
        // (and so never one longer than isize::MAX) exists.
        if offset
            .checked_add(len)
            .is_none_or(|end| end > r.pages() * 4096)
        {
            return EINVAL;
        }
        let data = if len == 0 {
            &[][..]
        } else {
            // SAFETY: `src` is non-NULL and readable for `len` bytes per the contract.
            unsafe { std::slice::from_raw_parts(src, len) }
        };
        if r.window().write_at(offset, data) {
            0
        } else {
            EINVAL
        }
    })
}

/// Page `i` (4096 bytes, writable while the reservation is held: see
/// `zcfs_zcopy_from`) of reservation `id`; NULL if there is none, or the reservation
/// was committed or given back.
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_zcopy_page(h: *mut zcfs_client, id: u64, i: usize) -> *mut u8 {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: per this function's contract.
        let h = unsafe { client(h) }.ok()?;
        let r = h.reservations.get_mut(&id)?;
        (i < r.pages()).then(|| r.window().page_mut(i).as_mut_ptr())
    }));
    r.ok().flatten().unwrap_or(std::ptr::null_mut())
}

/// Give reservation `id` back unused (-EINVAL if this connection does not hold it).
/// Its window's pointers must not be written after (see `zcfs_zcopy_from`).
///
/// # Safety
/// As [`client`].
#[no_mangle]
pub unsafe extern "C" fn zcfs_zcopy_abort(h: *mut zcfs_client, id: u64) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        let Some(r) = h.reservations.remove(&id) else {
            return EINVAL;
        };
        h.c.release_reservation(r).map_or_else(|e| neg(&e), |_| 0)
    })
}

/// A new, empty placement transaction (NULL only if out of memory).
#[no_mangle]
pub extern "C" fn zcfs_pflush_new() -> *mut zcfs_pflush {
    catch_unwind(|| {
        Box::into_raw(Box::new(zcfs_pflush {
            placements: Vec::new(),
        }))
    })
    .unwrap_or(std::ptr::null_mut())
}

/// Free a transaction (NULL is ignored).
///
/// # Safety
/// `t` is NULL or from `zcfs_pflush_new`, not used after.
#[no_mangle]
pub unsafe extern "C" fn zcfs_pflush_free(t: *mut zcfs_pflush) {
    if !t.is_null() {
        // SAFETY: from Box::into_raw in zcfs_pflush_new, given up here.
        drop(unsafe { Box::from_raw(t) });
    }
}

/// Add to `t`: reservation `reservation`'s pages go to 4 KiB-aligned `file_offset` of
/// `file`; the file grows to `new_size` (inside the last page) or, with
/// `ZCFS_NO_NEW_SIZE`, to the end of the last page. -E2BIG past `ZCFS_PFLUSH_MAX`.
///
/// # Safety
/// `t` is NULL or a live transaction.
#[no_mangle]
pub unsafe extern "C" fn zcfs_pflush_add(
    t: *mut zcfs_pflush,
    file: u32,
    file_offset: u64,
    reservation: u64,
    new_size: u64,
) -> c_int {
    guard_int(|| {
        // SAFETY: NULL or live and unaliased per the contract.
        let Some(t) = (unsafe { t.as_mut() }) else {
            return EINVAL;
        };
        if t.placements.len() >= ZCFS_PFLUSH_MAX {
            return -(libc::E2BIG as i64);
        }
        t.placements.push(Placement {
            handle: file,
            file_offset,
            reservation,
            new_size,
        });
        0
    })
}

/// FLAC pflush: place all of `t`'s reservations into their files in one atomic commit
/// (after a crash all are in their files or none is).
///
/// Whatever it returns (but -EINVAL for a NULL `h` or `t`), `t` is emptied and every
/// reservation it names that this connection holds is consumed: on 0 their blocks
/// are the files'; on an error (a reservation not held or named twice: -EINVAL; the
/// server's checks; the volume out of log or space; the connection lost) they are
/// given back, so reserve and fill again. Either way their window pointers must not
/// be written any more: a write would change a file in place, outside the log, or a
/// freed block. `zcfs_zcopy_page` returns NULL for them.
///
/// # Safety
/// As [`client`]; `t` is NULL or a live transaction.
#[no_mangle]
pub unsafe extern "C" fn zcfs_pflush_commit(h: *mut zcfs_client, t: *mut zcfs_pflush) -> c_int {
    guard_int(|| {
        // SAFETY: per this function's contract.
        let h = try_ffi!(unsafe { client(h) });
        // SAFETY: NULL or live and unaliased per the contract.
        let Some(t) = (unsafe { t.as_mut() }) else {
            return EINVAL;
        };
        let mut places = Vec::with_capacity(t.placements.len());
        let mut all_held = true;
        for p in t.placements.drain(..) {
            match h.reservations.remove(&p.reservation) {
                Some(r) => places.push(Place {
                    handle: p.handle,
                    file_offset: p.file_offset,
                    reservation: r,
                    new_size: p.new_size,
                }),
                None => all_held = false,
            }
        }
        if !all_held || places.is_empty() {
            for p in places {
                let _ = h.c.release_reservation(p.reservation);
            }
            return EINVAL;
        }
        h.c.commit(places).map_or_else(|e| neg(&e), |_| 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_eio_and_does_not_unwind_further() {
        assert_eq!(guard(|| panic!("inside the library")), -(libc::EIO as i64));
        assert_eq!(guard_int(|| panic!("inside the library")), -libc::EIO);
        assert_eq!(guard(|| 7), 7);
    }
}
