#!/usr/bin/env python3
"""zcfs same-host interface from Python (ctypes over libzcfs, numpy over the shared
memory): write and read a file in shared-buffer mode, and, when the server trusts this
process with the direct map, read it with zero copies and write pages in place.

    ZCFS_LIB=target/release/libzcfs.so python3 examples/python/samehost.py /run/zcfs/vol.samehost.sock

Every array below is a numpy view over memory the library returns (the registered
buffer, the read-only direct map, a reservation's window): no payload byte is copied
into a Python object.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zcfs  # noqa: E402

LEN = 10000


def main(sock):
    with zcfs.Client(sock) as c:
        print(f"connected trusted={int(c.trusted)}")
        bid, buf = c.register_buffer(1 << 16)
        # The array is the shared buffer itself, not a copy of it.
        print(f"buffer {bid} len={buf.size} numpy_view={int(buf.base is not None and not buf.flags.owndata)}")

        fh, _ = c.open("/hello-py")
        pattern = (np.arange(LEN, dtype=np.uint32) * 7 + 3).astype(np.uint8)
        buf[:LEN] = pattern
        wrote = c.write(fh, 0, bid, 0, LEN)
        c.fsync(fh)
        buf[:] = 0
        got = c.read(fh, 0, bid, 32768, LEN + 100)
        same = got == LEN and np.array_equal(buf[32768 : 32768 + LEN], pattern)
        print(f"shared wrote={wrote} read={got} match={int(same)}")

        # A float32 tensor written from and read into the buffer, viewed in place.
        t = buf[:4096].view(np.float32)
        t[:] = np.linspace(0.0, 1.0, t.size, dtype=np.float32)
        c.write(fh, 16384, bid, 0, 4096)
        buf[:4096] = 0
        c.read(fh, 16384, bid, 0, 4096)
        print(f"tensor float32 n={t.size} sum={float(t.sum()):.1f}")

        if c.trusted:
            # zcopy_to: numpy views of the extents, in the read-only direct map.
            with c.zcopy_to(fh, 0, LEN) as lease:
                ok = True
                for (foff, n), v in zip(lease.extents, lease.views):
                    want = pattern[foff : foff + n] if foff < LEN else np.zeros(n, np.uint8)
                    ok &= v is not None and np.array_equal(v[: len(want)], want)
                ro = all(v is None or not v.flags.writeable for v in lease.views)
                print(f"zcopy_to covered={lease.covered} extents={len(lease.extents)} match={int(ok)} readonly={int(ro)}")

            # read_mapped: the same bytes in place, the leases kept for the next read.
            pieces = c.read_mapped(fh, 0, LEN)
            got = np.concatenate([v if v is not None else np.zeros(0, np.uint8) for _, v in pieces])
            ok = np.array_equal(got[:LEN], pattern[:LEN])
            del pieces, got
            c.forget_mapped(fh)
            print(f"read_mapped match={int(ok)}")

            # zcopy_from: fill two fresh pages in place, place them at 64 KiB, commit.
            r = c.zcopy_from(2)
            for p in range(2):
                r.page(p)[:] = ord("A") + p
            with zcfs.Pflush(c) as t:
                t.add(fh, 65536, r, 65536 + 8000)
                t.commit()
            n = c.read(fh, 65536 + 4095, bid, 0, 4096)
            print(f"pflush read={n} bytes={chr(buf[0])}{chr(buf[1])}")
            # The pages are the file's now: the reservation hands out no writable view.
            try:
                r.page(0)
                refused = False
            except zcfs.ZcfsError:
                refused = True
            print(f"after commit window={r.window} page_refused={int(refused)}")
            c.pfree(fh, 65536, 4096)
        c.close_file(fh)
        print("closed")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} SOCKET", file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
