#!/usr/bin/env python3
"""Print the mount table of scripts/bench-mount.sh (issue 11) from its mount.csv: zcfs
beside sshfs and the client library, the ratios, and whether each goal holds."""
import csv
import sys

rows = {}
for r in csv.DictReader(open(sys.argv[1])):
    try:
        rows[(r["target"], r["test"])] = (float(r["value"]), r["unit"])
    except ValueError:
        pass


def v(target, test):
    return rows.get((target, test), (None, ""))[0]


def fmt(x, unit):
    if x is None:
        return "–"
    if unit == "s":
        return f"{x:.3f} s"
    if unit == "IOPS":
        return f"{x / 1000:.1f}k IOPS"
    if unit == "p50_us":
        return f"{x:.1f} µs p50"
    return f"{x:.0f} MB/s"


# (test, what a user does, library test to compare with, goals)
# goal kinds: ("min", x) value >= x; ("xsshfs", k) better than sshfs by k;
# ("lib%", p) >= p % of the library's; ("lib+us", d) p50 <= library p50 + d.
TABLE = [
    ("cp-512m", "`cp` of a 512 MiB file", "seq-write-1m-qd16", [("min", 1500), ("xsshfs", 5), ("lib%", 60)]),
    ("dd-write-128k", "`dd bs=128k conv=fsync` write", "seq-write-1m-qd16", [("min", 1500), ("xsshfs", 5), ("lib%", 60)]),
    ("dd-write-1m", "`dd bs=1M conv=fsync` write", "seq-write-1m-qd16", [("min", 1500), ("xsshfs", 5), ("lib%", 60)]),
    ("dd-read-1m-cold", "`dd bs=1M` read, page cache dropped", "seq-read-1m-qd16", [("min", 2000), ("xsshfs", 5), ("lib%", 60)]),
    ("buffered-randwrite-4k-qd1", "4 KiB buffered random write, QD1", None, [("xsshfs", 1)]),
    ("randread-4k-qd1", "4 KiB O_DIRECT random read, QD1", "randread-4k-qd1", [("lib+us", 10)]),
    ("randwrite-4k-qd1", "4 KiB O_DIRECT random write, QD1", "randwrite-4k-qd1", [("lib+us", 10)]),
    ("randread-4k-qd16", "4 KiB O_DIRECT random read, QD16", "randread-4k-qd16", [("min", 100000)]),
    ("ls-l-2000", "`ls -l` of 2,000 entries (cold)", None, [("xsshfs", 1)]),
    ("create-2000-files", "create+write+close 2,000 4 KiB files", None, [("xsshfs", 3)]),
    ("git-clone", "`git clone` of a local repository", None, [("xsshfs", 3)]),
    ("tar-x", "`tar x` of the source tree", None, [("xsshfs", 3)]),
]


def better_ratio(z, s, unit):
    """How many times zcfs is better than sshfs (>1: zcfs better)."""
    if z is None or s is None or z == 0 or s == 0:
        return None
    return s / z if unit in ("s", "p50_us") else z / s


before = any(t == "zcfs-before" for t, _ in rows)
tmpfs = any(t == "tmpfs" for t, _ in rows)
print("| what a user does | zcfs mount | sshfs | zcfs vs sshfs | client library | goal | met |"
      + (" zcfs before (baseline build) | now vs before |" if before else "")
      + (" local tmpfs (no network, no FUSE) |" if tmpfs else ""))
print("|---|---:|---:|---:|---:|---|:-:|" + ("---:|---:|" if before else "") + ("---:|" if tmpfs else ""))
met_all = True
for test, what, lib, goals in TABLE:
    z, unit = rows.get(("zcfs", test), (None, ""))
    s = v("sshfs", test)
    lv = v("library", lib) if lib else None
    ratio = better_ratio(z, s, unit)
    verdicts, texts = [], []
    for kind, x in goals:
        ok = None
        if kind == "min":
            texts.append(f"≥ {fmt(x, unit)}")
            ok = z is not None and z >= x
        elif kind == "xsshfs":
            texts.append("≥ sshfs" if x == 1 else f"≥ {x}x sshfs")
            ok = None if ratio is None else ratio >= x
        elif kind == "lib%":
            texts.append(f"≥ {x} % of library")
            ok = None if (z is None or lv is None) else z >= lv * x / 100
        elif kind == "lib+us":
            texts.append(f"≤ library + {x} µs")
            ok = None if (z is None or lv is None) else z <= lv + x
        verdicts.append(ok)
    met = "n/a" if any(o is None for o in verdicts) else ("yes" if all(verdicts) else "**no**")
    if met != "yes":
        met_all = False
    lib_txt = fmt(lv, unit) if lib else ""
    if lib and lv and z:
        lib_txt += f" ({100 * z / lv:.0f} %)" if unit in ("MB/s", "IOPS") else f" (+{z - lv:.1f} µs)"
    extra = ""
    if before:
        b = v("zcfs-before", test)
        gain = better_ratio(z, b, unit)
        extra = f" {fmt(b, unit)} | {'–' if gain is None else f'{gain:.2f}x'} |"
    if tmpfs:
        extra += f" {fmt(v('tmpfs', test), unit)} |"
    print(f"| {what} | {fmt(z, unit)} | {fmt(s, unit)} | "
          f"{'–' if ratio is None else f'{ratio:.2f}x'} | {lib_txt} | {', '.join(texts)} | {met} |"
          + extra)
print()
print("All goals met." if met_all else "Not every goal is met (see the last column).")
