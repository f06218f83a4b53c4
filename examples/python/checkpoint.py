#!/usr/bin/env python3
"""Checkpoint save and restore of tensor-like data (FLAC's application, issue 13):
several hundred numpy arrays of random bytes, of mixed sizes, saved as one atomic set
and restored (read back and verified by CRC-32).

Targets:
  direct  the same-host interface's direct map (libzcfs through ctypes): each array is
          copied once, by numpy, straight into fresh volume pages (zcopy_from), placed
          with pflush_add and committed with pflush_commit; restore leases the pages
          (zcopy_to) and checksums them in place, no copy.
  mount   the same files through a local `zcfs mount` of an image (FUSE).
  tmpfs   the same files in a /dev/shm directory.

The set is atomic on every target. On `direct`, the files go to one of two slots
(/ckpt.<slot>.<name>) in commits of at most BATCH_BYTES, and one last pflush commit
replaces the manifest (/ckpt.MANIFEST, a fixed MANIFEST_BYTES) that names the slot,
the generation and every file's size and CRC: a crash before it returns leaves the
previous manifest, which names the previous slot's files, untouched (docs/samehost.md
says why one commit does not carry the whole set). On the file-system targets the same
protocol is the POSIX one: files in slot directories, fsync each, manifest written to
a temporary name, fsync, rename.

    checkpoint.py bench --zcfs target/release/zcfs --total 2G --files 400 --out ckpt.json
    checkpoint.py save --sock S --gen N [--total ..] [--files ..] [--pause-at K,...]
    checkpoint.py restore --sock S [--expect-gens 1,2]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zcfs  # noqa: E402

PAGE = zcfs.PAGE
MANIFEST = "ckpt.MANIFEST"
# The manifest is always this long (JSON padded with spaces): a pflush never shrinks a
# file, and a fixed size makes one commit replace it whole. 2 MiB holds ~20 000 entries.
MANIFEST_BYTES = 2 << 20
# Pages reserved and not yet committed at once: half of the server's per-connection
# bound (MAX_RESERVED_BLOCKS = 65 536 pages = 256 MiB).
BATCH_BYTES = 128 << 20
# Most bytes one lease covers in a restore (the server's MAX_LEASED_BLOCKS is 256 MiB).
LEASE_BYTES = 64 << 20
# Most placements one commit carries (ZCFS_PFLUSH_MAX: each names its own reservation,
# and a connection holds at most 1024).
BATCH_PLACEMENTS = zcfs.PFLUSH_MAX


def parse_size(s):
    s = str(s).strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


# ---------------------------------------------------------------- the tensors

def layout(total, nfiles, seed=7):
    """Names and sizes of `nfiles` files adding up to `total` bytes: log-uniform
    sizes (a few large weight matrices, many small biases and optimizer scalars), most
    not a multiple of the page size."""
    rng = np.random.default_rng(seed)
    w = np.exp(rng.uniform(np.log(1.0), np.log(4096.0), nfiles))
    sizes = np.maximum((w / w.sum() * total).astype(np.int64), 1)
    # Flooring leaves a remainder (>= 0): the first file takes it.
    sizes[0] += total - int(sizes.sum())
    return [(f"layer{i:04d}.bin", int(n)) for i, n in enumerate(sizes)]


class Tensors:
    """The arrays of generation `gen`: random bytes, each file its own (a random pool
    XORed with a per-file, per-generation random word)."""

    def __init__(self, files, gen):
        self.files = files
        total = sum(n for _, n in files)
        pool_len = min(total, 256 << 20) + 8 * len(files) + 16
        rng = np.random.default_rng(1000 + gen)
        pool = rng.integers(0, 2**64 - 1, pool_len // 8 + 1, dtype=np.uint64, endpoint=True)
        keys = rng.integers(1, 2**64 - 1, len(files), dtype=np.uint64, endpoint=True)
        self.arrays = []
        at = 0
        for (_, n), k in zip(files, keys):
            words = (n + 7) // 8
            if at + words > pool.size:
                at = 0
            a = np.bitwise_xor(pool[at : at + words], k).view(np.uint8)[:n]
            at += words // 2 + 1  # overlapping slices, different keys
            self.arrays.append(a)
        self.crcs = [zlib.crc32(a) for a in self.arrays]

    def __iter__(self):
        return iter(zip(self.files, self.arrays, self.crcs))


def manifest_bytes(gen, slot, tensors):
    m = {
        "gen": gen,
        "slot": slot,
        "files": [[name, n, crc] for (name, n), _, crc in tensors],
    }
    b = json.dumps(m, separators=(",", ":")).encode()
    if len(b) >= MANIFEST_BYTES:
        raise ValueError(f"manifest of {len(b)} bytes: more than {MANIFEST_BYTES}")
    return b + b" " * (MANIFEST_BYTES - len(b))


# ---------------------------------------------------------------- direct map

class Pauser:
    """Kill points for the crash test: at each listed step, print it and wait for a
    line on stdin (the test SIGKILLs this process, or the server, meanwhile)."""

    def __init__(self, at):
        self.at = set(at)
        self.step = 0

    def __call__(self, what):
        self.step += 1
        if self.step in self.at:
            print(f"paused step={self.step} {what}", flush=True)
            sys.stdin.readline()


def read_manifest_direct(c):
    """The manifest (a dict), or None when there is none."""
    try:
        fh, size = c.open("/" + MANIFEST, os.O_RDONLY, 0)
    except zcfs.ZcfsError as e:
        if e.errno == 2:
            return None
        raise
    try:
        if size == 0:
            return None
        with c.zcopy_to(fh, 0, size) as lease:
            raw = b"".join(v.tobytes() for v in lease.views if v is not None)
        return json.loads(raw.rstrip(b" \0"))
    finally:
        c.close_file(fh)


class Stats:
    def __init__(self):
        self.fill_s = 0.0  # numpy copying into the pages
        self.calls_s = 0.0  # library calls (reserve, commit, open, ...)
        self.paged_fallbacks = 0  # reservations not contiguous: filled page by page
        self.commits = 0


def save_direct(c, tensors, gen, pause=lambda what: None, stats=None):
    """Save `tensors` as generation `gen`: data into the slot the manifest does not
    name, in commits of at most BATCH_BYTES, then one commit of the manifest."""
    st = stats or Stats()
    t0 = time.perf_counter()
    old = read_manifest_direct(c)
    slot = 1 - old["slot"] if old else 0
    tx = zcfs.Pflush(c)
    held = 0
    handles = []

    def commit():
        nonlocal held
        if tx.n:
            pause(f"before data commit {st.commits + 1}")
            tx.commit()
            st.commits += 1
            pause(f"after data commit {st.commits}")
        for h in handles:
            c.close_file(h)
        handles.clear()
        held = 0

    try:
        for (name, n), arr, _ in tensors:
            # The slot's files belong to no manifest: truncating them is safe.
            fh, _ = c.open(f"/ckpt.{slot}.{name}", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            handles.append(fh)
            pages = (n + PAGE - 1) // PAGE
            done = 0
            while done < pages:
                k = min(pages - done, zcfs.RESERVE_MAX, BATCH_BYTES // PAGE)
                if held + k * PAGE > BATCH_BYTES or tx.n >= BATCH_PLACEMENTS:
                    commit()
                    fh, _ = c.open(f"/ckpt.{slot}.{name}", os.O_RDWR, 0)
                    handles.append(fh)
                r = c.zcopy_from(k)
                held += k * PAGE
                lo, hi = done * PAGE, min((done + k) * PAGE, n)
                t = time.perf_counter()
                if r.window is None:
                    st.paged_fallbacks += 1
                r.fill(arr[lo:hi])
                st.fill_s += time.perf_counter() - t
                last = done + k == pages
                tx.add(fh, lo, r, n if last else zcfs.NO_NEW_SIZE)
                done += k
        commit()
        # The switch: one commit replaces the whole manifest.
        m = manifest_bytes(gen, slot, tensors)
        mfh, _ = c.open("/" + MANIFEST, os.O_RDWR | os.O_CREAT, 0o644)
        r = c.zcopy_from(MANIFEST_BYTES // PAGE)
        r.fill(np.frombuffer(m, np.uint8))
        tx.add(mfh, 0, r, MANIFEST_BYTES)
        pause("before manifest commit")
        tx.commit()
        # The commit is atomic, but the volume's group commit may still hold it: fsync
        # makes it durable before the save is reported done (a server killed after the
        # commit returned lost it without this; see the crash test).
        c.fsync(mfh)
        print(f"committed gen={gen} slot={slot}", flush=True)
        pause("after manifest commit")
        c.close_file(mfh)
    finally:
        tx.free()
    total = time.perf_counter() - t0
    st.calls_s = total - st.fill_s
    return total


def restore_direct(c, expect=None):
    """Lease every file of the manifest and CRC it in place. Returns (manifest, bytes).
    Raises if a file's size or CRC is not the manifest's, or (with `expect`, a dict
    gen -> Tensors) not that generation's."""
    m = read_manifest_direct(c)
    if m is None:
        raise RuntimeError("no manifest")
    total = 0
    want = expect[m["gen"]] if expect else None
    for i, (name, n, crc) in enumerate(m["files"]):
        fh, size = c.open(f"/ckpt.{m['slot']}.{name}", os.O_RDONLY, 0)
        if size != n:
            raise RuntimeError(f"{name}: size {size}, manifest says {n}")
        got = 0
        off = 0
        while off < n:
            k = min(LEASE_BYTES, n - off)
            with c.zcopy_to(fh, off, k) as lease:
                for (foff, ln), v in zip(lease.extents, lease.views):
                    ln = min(ln, n - foff)
                    got = zlib.crc32(v[:ln] if v is not None else bytes(ln), got)
            off += k
        c.close_file(fh)
        if got != crc:
            raise RuntimeError(f"{name}: crc {got:#x}, manifest says {crc:#x}")
        if want is not None and (want.files[i] != (name, n) or want.crcs[i] != crc):
            raise RuntimeError(f"{name}: not generation {m['gen']}'s")
        total += n
    return m, total


# ---------------------------------------------------------------- a directory (mount, tmpfs)

def save_dir(root, tensors, gen):
    t0 = time.perf_counter()
    mpath = os.path.join(root, MANIFEST)
    old = json.loads(open(mpath, "rb").read()) if os.path.exists(mpath) else None
    slot = 1 - old["slot"] if old else 0
    d = os.path.join(root, f"ckpt.{slot}")
    os.makedirs(d, exist_ok=True)
    for (name, _), arr, _ in tensors:
        fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            mv = memoryview(arr)
            while len(mv):
                mv = mv[os.write(fd, mv) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    tmp = mpath + ".tmp"
    with open(tmp, "wb") as f:
        f.write(manifest_bytes(gen, slot, tensors).rstrip(b" "))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, mpath)
    dfd = os.open(root, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    return time.perf_counter() - t0


def restore_dir(root):
    m = json.loads(open(os.path.join(root, MANIFEST), "rb").read())
    d = os.path.join(root, f"ckpt.{m['slot']}")
    big = max(n for _, n, _ in m["files"])
    buf = np.empty(big, np.uint8)
    total = 0
    for name, n, crc in m["files"]:
        with open(os.path.join(d, name), "rb", buffering=0) as f:
            mv = memoryview(buf)[:n]
            got = 0
            while got < n:
                k = f.readinto(mv[got:])
                if not k:
                    raise RuntimeError(f"{name}: short read at {got} of {n}")
                got += k
        if zlib.crc32(buf[:n]) != crc:
            raise RuntimeError(f"{name}: crc differs from the manifest's")
        total += n
    return m, total


# ---------------------------------------------------------------- the benchmark

def wait_for(what, f, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if f():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not within {timeout} s")


def stop(p):
    if p and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def row(target, op, nbytes, nfiles, secs, **extra):
    r = {
        "target": target,
        "op": op,
        "bytes": nbytes,
        "files": nfiles,
        "seconds": round(secs, 4),
        "mb_s": round(nbytes / secs / 1e6, 1),
    }
    r.update(extra)
    print(f"{target:7} {op:8} {nbytes / 2**20:8.0f} MiB {nfiles:4} files {secs:7.3f} s {r['mb_s']:8.1f} MB/s"
          + "".join(f" {k}={v}" for k, v in extra.items()), file=sys.stderr, flush=True)
    return r


def bench(a):
    total = parse_size(a.total)
    files = layout(total, a.files)
    gens = [Tensors(files, g) for g in range(1, a.reps + 1)]
    rows = []
    work = tempfile.mkdtemp(prefix="zcfs-ckpt-", dir="/dev/shm")
    img_size = str(2 * total + (1 << 30))
    procs, mounts = [], []
    try:
        # direct: `zcfs serve IMG --samehost SOCK`.
        img = os.path.join(work, "direct.img")
        subprocess.run([a.zcfs, "mkfs", img, "--size", img_size], check=True, stdout=subprocess.DEVNULL)
        sock = os.path.join(work, "s.sock")
        p = subprocess.Popen(
            [a.zcfs, "serve", img, "--listen", "unix:" + os.path.join(work, "main.sock"), "--samehost", sock, "--no-root-squash"],
            stdout=subprocess.DEVNULL,
        )
        procs.append(p)
        wait_for("samehost socket", lambda: os.path.exists(sock))
        with zcfs.Client(sock) as c:
            if not c.trusted:
                raise RuntimeError("the direct map needs a trusted process (root or the image's owner)")
            # Setup, once per process, as an application would at start: the image's
            # pages mapped now, so no save's fill takes page faults. Timed and reported.
            t0 = time.perf_counter()
            done = c.prefault()
            prefault_s = round(time.perf_counter() - t0, 3)
            print(f"direct  prefault of the image's mapping: {prefault_s} s (done={done})", file=sys.stderr, flush=True)
            for g, t in enumerate(gens, 1):
                st = Stats()
                s = save_direct(c, t, g, stats=st)
                rows.append(row("direct", "save", total, len(files), s, rep=g, fill_s=round(st.fill_s, 3),
                                calls_s=round(st.calls_s, 3), commits=st.commits + 1,
                                paged_fallbacks=st.paged_fallbacks, prefault_s=prefault_s))
                t0 = time.perf_counter()
                m, n = restore_direct(c, {g: t})
                rows.append(row("direct", "restore", n, len(files), time.perf_counter() - t0, rep=g))
        stop(p)
        os.unlink(img)

        # mount: `zcfs mount IMG DIR`.
        img = os.path.join(work, "mount.img")
        subprocess.run([a.zcfs, "mkfs", img, "--size", img_size], check=True, stdout=subprocess.DEVNULL)
        mp = tempfile.mkdtemp(prefix="zcfs-ckpt-mnt-")
        p = subprocess.Popen([a.zcfs, "mount", img, mp], stderr=subprocess.DEVNULL)
        procs.append(p)
        mounts.append(mp)
        wait_for("mount", lambda: os.path.ismount(mp))
        for g, t in enumerate(gens, 1):
            s = save_dir(mp, t, g)
            rows.append(row("mount", "save", total, len(files), s, rep=g))
            drop_caches()
            t0 = time.perf_counter()
            _, n = restore_dir(mp)
            rows.append(row("mount", "restore", n, len(files), time.perf_counter() - t0, rep=g))
        subprocess.run(["umount", mp], check=False)
        stop(p)
        os.unlink(img)

        # tmpfs: a /dev/shm directory.
        d = os.path.join(work, "tmpfs")
        os.makedirs(d)
        for g, t in enumerate(gens, 1):
            s = save_dir(d, t, g)
            rows.append(row("tmpfs", "save", total, len(files), s, rep=g))
            t0 = time.perf_counter()
            _, n = restore_dir(d)
            rows.append(row("tmpfs", "restore", n, len(files), time.perf_counter() - t0, rep=g))
    finally:
        for mp in mounts:
            if os.path.ismount(mp):
                subprocess.run(["umount", "-l", mp], check=False)
        for p in procs:
            stop(p)
        for mp in mounts:
            shutil.rmtree(mp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
    if a.table:
        with open(a.table, "w") as f:
            f.write(table(rows))
    return rows


def drop_caches():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def table(rows):
    """Markdown: best of the repetitions per target and op, and the ratios."""
    best = {}
    for r in rows:
        k = (r["target"], r["op"])
        if k not in best or r["seconds"] < best[k]["seconds"]:
            best[k] = r
    out = ["| target | op | bytes | files | seconds | MB/s | vs mount |", "|---|---|---|---|---|---|---|"]
    for t in ("direct", "mount", "tmpfs"):
        for op in ("save", "restore"):
            r = best.get((t, op))
            if not r:
                continue
            m = best.get(("mount", op))
            ratio = f"{m['seconds'] / r['seconds']:.2f}x" if m else ""
            out.append(f"| {t} | {op} | {r['bytes'] / 2**20:.0f} MiB | {r['files']} | {r['seconds']:.3f} | "
                       f"{r['mb_s']:.0f} | {ratio} |")
    pf = next((r["prefault_s"] for r in rows if "prefault_s" in r), None)
    if pf is not None:
        out.append("")
        out.append(f"direct: the image's mapping was faulted in once at connect ({pf} s), before the saves.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--zcfs", required=True, help="the zcfs binary")
    b.add_argument("--total", default="256M")
    b.add_argument("--files", type=int, default=300)
    b.add_argument("--reps", type=int, default=2)
    b.add_argument("--out", required=True, help="JSON rows")
    b.add_argument("--table", help="also write a Markdown table here")
    s = sub.add_parser("save")
    s.add_argument("--sock", required=True)
    s.add_argument("--gen", type=int, required=True)
    s.add_argument("--total", default="8M")
    s.add_argument("--files", type=int, default=40)
    s.add_argument("--pause-at", default="", help="steps to stop at (comma-separated)")
    r = sub.add_parser("restore")
    r.add_argument("--sock", required=True)
    r.add_argument("--total", default="8M")
    r.add_argument("--files", type=int, default=40)
    r.add_argument("--expect-gens", default="", help="generations the data must be one of")
    a = ap.parse_args()
    if a.cmd == "bench":
        bench(a)
    elif a.cmd == "save":
        files = layout(parse_size(a.total), a.files)
        pause = Pauser(int(x) for x in a.pause_at.split(",") if x)
        with zcfs.Client(a.sock) as c:
            save_direct(c, Tensors(files, a.gen), a.gen, pause)
        print(f"steps={pause.step}", flush=True)
    elif a.cmd == "restore":
        files = layout(parse_size(a.total), a.files)
        expect = {int(g): Tensors(files, int(g)) for g in a.expect_gens.split(",") if g}
        with zcfs.Client(a.sock) as c:
            m, n = restore_direct(c, expect or None)
        print(f"restored gen={m['gen']} slot={m['slot']} files={len(m['files'])} bytes={n}", flush=True)


if __name__ == "__main__":
    main()
