#!/usr/bin/env python3
"""Where a direct-map checkpoint save's time goes: three saves of 2 GiB (400 files) on one
same-host connection, each library call timed from Python, plus the fill (numpy's copy
into the windows), scattered reservations filled through zcfs_zcopy_fill, and the
process's minor page faults.

    ZCFS_LIB=target/release/libzcfs.so /usr/bin/python3 scripts/profile-checkpoint.py target/release/zcfs [SLEEP_S]

SLEEP_S (default 0): seconds to wait after connecting, so background prefaulting ends
before the first save. Starts and stops its own server; images on /dev/shm.
"""
import collections
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
import checkpoint as ck  # noqa: E402
import zcfs  # noqa: E402

T = collections.defaultdict(float)
N = collections.Counter()


def timed(obj, name):
    f = getattr(obj, name)

    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[name] += time.perf_counter() - t
            N[name] += 1

    setattr(obj, name, w)


def minflt():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])


def main():
    z = sys.argv[1]
    sleep_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    for n in ("open", "zcopy_from", "close_file", "fsync"):
        timed(zcfs.Client, n)
    for n in ("add", "commit"):
        timed(zcfs.Pflush, n)
    total = 2 << 30
    files = ck.layout(total, 400)
    gens = [ck.Tensors(files, g) for g in (1, 2, 3)]
    work = tempfile.mkdtemp(prefix="zcfs-profck-", dir="/dev/shm")
    img, sock = os.path.join(work, "d.img"), os.path.join(work, "s.sock")
    subprocess.run([z, "mkfs", img, "--size", str(2 * total + (1 << 30))], check=True, stdout=subprocess.DEVNULL)
    p = subprocess.Popen([z, "serve", img, "--listen", "unix:" + os.path.join(work, "m.sock"),
                          "--samehost", sock, "--no-root-squash"], stdout=subprocess.DEVNULL)
    try:
        ck.wait_for("samehost socket", lambda: os.path.exists(sock))
        with zcfs.Client(sock) as c:
            time.sleep(sleep_s)
            for g, t in enumerate(gens, 1):
                T.clear()
                N.clear()
                f0 = minflt()
                st = ck.Stats()
                s = ck.save_direct(c, t, g, stats=st)
                calls = " ".join(f"{k}={T[k]:.3f}s/{N[k]}" for k in sorted(T))
                print(f"save {g}: {s:.3f} s fill {st.fill_s:.3f} s scattered {st.paged_fallbacks} "
                      f"minflt {minflt() - f0} {calls}", flush=True)
    finally:
        p.terminate()
        p.wait()
        subprocess.run(["rm", "-rf", work], check=False)


if __name__ == "__main__":
    main()
