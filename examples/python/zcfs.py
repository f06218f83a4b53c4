"""ctypes binding of libzcfs, the same-host interface's C ABI (crates/samehost-c,
include/zcfs.h; docs/samehost.md).

Buffers and extents are exposed as numpy arrays *over* the shared memory (numpy
views made from the pointers the library returns): no byte is copied into a Python
object. Calls that fail raise ZcfsError with the errno.

The library is found at $ZCFS_LIB, else target/release/libzcfs.so of this checkout,
else through the dynamic loader ("libzcfs.so", e.g. after installing zcfs.pc).
"""

import ctypes
import ctypes.util
import errno as _errno
import os

import numpy as np

PAGE = 4096
NO_NEW_SIZE = 0xFFFF_FFFF_FFFF_FFFF
RESERVE_MAX = 32768  # ZCFS_RESERVE_MAX: most pages one zcopy_from reserves
PFLUSH_MAX = 1024  # ZCFS_PFLUSH_MAX: placements one transaction holds (each names its
# own reservation; a connection holds at most 1024 at once)


class ZcfsError(OSError):
    pass


def _check(r, what):
    if r < 0:
        raise ZcfsError(-r, f"{what}: {os.strerror(-r)}")
    return r


class Extent(ctypes.Structure):
    _fields_ = [
        ("file_offset", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
        ("data", ctypes.c_void_p),
    ]


def _find_lib():
    p = os.environ.get("ZCFS_LIB")
    if p:
        return p
    here = os.path.dirname(os.path.abspath(__file__))
    for t in (os.environ.get("CARGO_TARGET_DIR"), os.path.join(here, "../../target")):
        if t and os.path.exists(os.path.join(t, "release/libzcfs.so")):
            return os.path.join(t, "release/libzcfs.so")
    return ctypes.util.find_library("zcfs") or "libzcfs.so"


def load(path=None):
    lib = ctypes.CDLL(path or _find_lib(), use_errno=True)
    vp, u32, u64, i64, sz = (
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_uint64,
        ctypes.c_int64,
        ctypes.c_size_t,
    )
    P = ctypes.POINTER
    sig = {
        "zcfs_connect": (vp, [ctypes.c_char_p]),
        "zcfs_disconnect": (None, [vp]),
        "zcfs_trusted": (ctypes.c_int, [vp]),
        "zcfs_prefault": (ctypes.c_int, [vp]),
        "zcfs_register_buffer": (ctypes.c_int, [vp, sz, P(u32)]),
        "zcfs_buffer_ptr": (vp, [vp, u32, P(sz)]),
        "zcfs_open": (ctypes.c_int, [vp, ctypes.c_char_p, ctypes.c_int, u32, P(u32), P(u64)]),
        "zcfs_close": (ctypes.c_int, [vp, u32]),
        "zcfs_read": (i64, [vp, u32, u64, u32, u64, u64]),
        "zcfs_write": (i64, [vp, u32, u64, u32, u64, u64]),
        "zcfs_fsync": (ctypes.c_int, [vp, u32]),
        "zcfs_pfree": (ctypes.c_int, [vp, u32, u64, u64]),
        "zcfs_zcopy_to": (i64, [vp, u32, u64, u64, P(Extent), sz, P(sz), P(u64)]),
        "zcfs_zcopy_release": (ctypes.c_int, [vp, u64]),
        "zcfs_read_mapped": (i64, [vp, u32, u64, u64, P(Extent), sz, P(sz)]),
        "zcfs_forget_mapped": (ctypes.c_int, [vp, u32]),
        "zcfs_zcopy_from": (ctypes.c_int, [vp, sz, P(u64), P(vp)]),
        "zcfs_zcopy_page": (vp, [vp, u64, sz]),
        "zcfs_zcopy_fill": (ctypes.c_int, [vp, u64, sz, vp, sz]),
        "zcfs_zcopy_abort": (ctypes.c_int, [vp, u64]),
        "zcfs_pflush_new": (vp, []),
        "zcfs_pflush_free": (None, [vp]),
        "zcfs_pflush_add": (ctypes.c_int, [vp, u32, u64, u64, u64]),
        "zcfs_pflush_commit": (ctypes.c_int, [vp, vp]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    return lib


def view(ptr, n, writable=True):
    """A numpy uint8 array over `n` bytes at address `ptr` (no copy)."""
    if n == 0:
        return np.empty(0, np.uint8)
    arr = (ctypes.c_uint8 * n).from_address(ptr)
    v = np.frombuffer(arr, dtype=np.uint8)
    if not writable:
        v.flags.writeable = False
    return v


class Lease:
    """Extents of a file range leased by zcopy_to: `views` are read-only numpy arrays
    into the direct map (None for a hole), valid until release()."""

    def __init__(self, client, lease, covered, extents):
        self.client, self.id, self.covered = client, lease, covered
        self.extents = [(e.file_offset, e.len) for e in extents]
        self.views = [None if not e.data else view(e.data, e.len, False) for e in extents]

    def release(self):
        if self.id is not None:
            self.views = []
            _check(self.client.lib.zcfs_zcopy_release(self.client.h, self.id), "zcopy_release")
            self.id = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.release()


class Reservation:
    """Fresh pages from zcopy_from: fill `window` (a numpy array over the whole
    reservation when its blocks are adjacent, else None: use page(i)).

    The pages may be written only while the reservation is held: a Pflush.commit that
    names it (whatever its result) or zcopy_abort ends it, and then `window` is None
    and page(i) raises. Keep no other reference to `window` or to a page(i) array past
    that: numpy cannot revoke a view, and a write through one would change a file's
    block in place, outside the log, or a freed block (see zcfs_zcopy_from in zcfs.h).
    """

    def __init__(self, client, rid, pages, whole):
        self.client, self.id, self.pages = client, rid, pages
        self.window = view(whole, pages * PAGE) if whole else None
        self.held = True

    def _end(self):
        self.held = False
        self.window = None

    def page(self, i):
        if not self.held:
            raise ZcfsError(_errno.EINVAL, f"reservation {self.id} was committed or given back")
        p = self.client.lib.zcfs_zcopy_page(self.client.h, self.id, i)
        if not p:
            raise ZcfsError(_errno.EINVAL, f"no page {i} in reservation {self.id}")
        return view(p, PAGE)

    def fill(self, data):
        """Copy `data` (a uint8 array of at most pages*4096 bytes) into the pages."""
        if not self.held:
            raise ZcfsError(_errno.EINVAL, f"reservation {self.id} was committed or given back")
        n = len(data)
        if self.window is not None:
            self.window[:n] = data
            return
        # Scattered pages: the library copies them all in one call (a call per page
        # from Python filled at ~1 GB/s).
        src = np.ascontiguousarray(data, dtype=np.uint8)
        _check(self.client.lib.zcfs_zcopy_fill(self.client.h, self.id, 0, src.ctypes.data, n), "zcopy_fill")


class Client:
    def __init__(self, sock, lib=None):
        self.lib = lib or load()
        h = self.lib.zcfs_connect(os.fsencode(sock))
        if not h:
            e = ctypes.get_errno()
            raise ZcfsError(e, f"connect {sock}: {os.strerror(e)}")
        self.h = h

    def close(self):
        if self.h:
            self.lib.zcfs_disconnect(self.h)
            self.h = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    @property
    def trusted(self):
        return _check(self.lib.zcfs_trusted(self.h), "trusted") == 1

    def prefault(self):
        """Fault the image into the direct map now (a setup cost paid once), so that no
        fill takes a page fault later. True when done; False where it is not free (an
        image with holes, or on disk)."""
        return _check(self.lib.zcfs_prefault(self.h), "prefault") == 1

    def register_buffer(self, n):
        """A shared buffer of n bytes: (id, numpy uint8 array over it)."""
        bid = ctypes.c_uint32()
        _check(self.lib.zcfs_register_buffer(self.h, n, ctypes.byref(bid)), "register_buffer")
        ln = ctypes.c_size_t()
        p = self.lib.zcfs_buffer_ptr(self.h, bid.value, ctypes.byref(ln))
        if not p:
            e = ctypes.get_errno()
            raise ZcfsError(e, f"buffer_ptr: {os.strerror(e)}")
        return bid.value, view(p, ln.value)

    def open(self, path, flags=os.O_RDWR | os.O_CREAT, mode=0o644):
        fh, size = ctypes.c_uint32(), ctypes.c_uint64()
        r = self.lib.zcfs_open(self.h, os.fsencode(path), flags, mode, ctypes.byref(fh), ctypes.byref(size))
        _check(r, f"open {path}")
        return fh.value, size.value

    def close_file(self, fh):
        _check(self.lib.zcfs_close(self.h, fh), "close")

    def read(self, fh, off, buf, buf_off, n):
        return _check(self.lib.zcfs_read(self.h, fh, off, buf, buf_off, n), "read")

    def write(self, fh, off, buf, buf_off, n):
        return _check(self.lib.zcfs_write(self.h, fh, off, buf, buf_off, n), "write")

    def fsync(self, fh):
        _check(self.lib.zcfs_fsync(self.h, fh), "fsync")

    def pfree(self, fh, off, n):
        _check(self.lib.zcfs_pfree(self.h, fh, off, n), "pfree")

    def zcopy_to(self, fh, off, n, cap=64):
        """Lease [off, off+n) of fh: a Lease of numpy views into the direct map."""
        while True:
            ext = (Extent * cap)()
            got, lease = ctypes.c_size_t(), ctypes.c_uint64()
            r = self.lib.zcfs_zcopy_to(self.h, fh, off, n, ext, cap, ctypes.byref(got), ctypes.byref(lease))
            if r == -_errno.ENOBUFS and got.value > cap:
                cap = got.value
                continue
            _check(r, "zcopy_to")
            return Lease(self, lease.value, r, ext[: got.value])

    def read_mapped(self, fh, off, n, cap=64):
        """[off, off+n) of fh as (file offset, read-only numpy view or None for a hole)
        pieces in the direct map, without a copy and, while the file is unchanged,
        without asking the server (the leases are kept). The views are valid only until
        the next call on this client: drop them before."""
        while True:
            ext = (Extent * cap)()
            got = ctypes.c_size_t()
            r = self.lib.zcfs_read_mapped(self.h, fh, off, n, ext, cap, ctypes.byref(got))
            if r == -_errno.ENOBUFS and got.value > cap:
                cap = got.value
                continue
            _check(r, "read_mapped")
            return [(e.file_offset, None if not e.data else view(e.data, e.len, False))
                    for e in ext[: got.value]]

    def forget_mapped(self, fh=None):
        """Give back the leases read_mapped keeps (of fh, or of every file)."""
        _check(self.lib.zcfs_forget_mapped(self.h, 0xFFFFFFFF if fh is None else fh), "forget_mapped")

    def zcopy_from(self, pages):
        rid, whole = ctypes.c_uint64(), ctypes.c_void_p()
        _check(self.lib.zcfs_zcopy_from(self.h, pages, ctypes.byref(rid), ctypes.byref(whole)), "zcopy_from")
        return Reservation(self, rid.value, pages, whole.value)

    def zcopy_abort(self, r):
        try:
            _check(self.lib.zcfs_zcopy_abort(self.h, r.id), "zcopy_abort")
        finally:
            r._end()


class Pflush:
    """A pflush transaction: add() placements, commit() them atomically."""

    def __init__(self, client):
        self.client = client
        self.t = client.lib.zcfs_pflush_new()
        self.n = 0
        self.reservations = []

    def add(self, fh, file_offset, reservation, new_size=NO_NEW_SIZE):
        _check(self.client.lib.zcfs_pflush_add(self.t, fh, file_offset, reservation.id, new_size), "pflush_add")
        self.reservations.append(reservation)
        self.n += 1

    def commit(self):
        """Place every added reservation atomically. Whatever the result, the
        reservations are consumed (on an error their pages are given back: reserve
        and fill again) and their windows are gone."""
        try:
            _check(self.client.lib.zcfs_pflush_commit(self.client.h, self.t), "pflush_commit")
        finally:
            for r in self.reservations:
                r._end()
            self.reservations = []
            self.n = 0

    def free(self):
        if self.t:
            self.client.lib.zcfs_pflush_free(self.t)
            self.t = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.free()
