#!/usr/bin/env python3
"""Turn one bench run (scripts/bench.sh) into results.md and PNG plots.

usage: bench-report.py RUN_DIR [--publish DOCS_DIR]

RUN_DIR holds remote.json, local.json (zcfs-bench), csv/*.csv (the shared baseline format:
suite,target,test,rw,bs,qd,engine,iops,mbps,lat_mean_us,lat_p50_us,lat_p99_us,note) and
csv/smallfiles.csv. With --publish, DOCS_DIR/benchmarks.md and DOCS_DIR/img/*.png are written.
"""
import csv, glob, json, os, platform, shutil, subprocess, sys

run = sys.argv[1]
publish = sys.argv[sys.argv.index("--publish") + 1] if "--publish" in sys.argv else None
plots = os.path.join(run, "plots")
os.makedirs(plots, exist_ok=True)


def load_json(name):
    p = os.path.join(run, name)
    return json.load(open(p)) if os.path.exists(p) else None


remote = load_json("remote.json") or {"rows": []}
local = load_json("local.json") or {"rows": []}
tbf = load_json("tbf1g/remote.json")
fio = []
for f in sorted(glob.glob(os.path.join(run, "csv", "*.csv"))):
    if f.endswith("smallfiles.csv") or f.endswith("cpu.csv"):
        continue
    fio += [r for r in csv.DictReader(open(f)) if r.get("iops") not in (None, "", "NA")]
cpu_path = os.path.join(run, "csv", "cpu.csv")
cpu_rows = list(csv.DictReader(open(cpu_path))) if os.path.exists(cpu_path) else []
small_path = os.path.join(run, "csv", "smallfiles.csv")
small = list(csv.DictReader(open(small_path))) if os.path.exists(small_path) else []

KIB = 1024
SIZES = [1 * KIB, 4 * KIB, 64 * KIB, 1 << 20, 16 << 20]
FIO_BS = {1 * KIB: ["1k", "1.0K"], 4 * KIB: ["4k", "4.0K"], 64 * KIB: ["64k", "64K"], 1 << 20: ["1m", "1.0M"], 16 << 20: ["16m", "16M"]}


def human(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def zrow(rows, system, op, pattern, size, qd):
    return next((r for r in rows if r["system"] == system and r["op"] == op and r["pattern"] in (pattern, "-") and r["size"] == size and r["qd"] == qd), None)


def frow(target, rw, size, qd=1, engine=None):
    """A fio row; by default the O_DIRECT/network engines, never the mmap test."""
    names = FIO_BS.get(size, [])
    for r in fio:
        if r["target"] == target and r["rw"] == rw and r["bs"] in names and int(r["qd"]) == qd:
            if (engine is None and r["engine"] != "mmap") or r["engine"] == engine:
                return r
    return None


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def fmt(v, d=1):
    return "-" if v is None else f"{v:.{d}f}"


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def distinct(rows, key, keep=lambda r: True):
    """The values of `key` in the rows `keep` takes, each once, in order of appearance."""
    return list(dict.fromkeys(r[key] for r in rows if keep(r)))


def cell(rows, target, test):
    """The row of `target` for `test`, or None."""
    return next((x for x in rows if x["target"] == target and x["test"] == test), None)


def grid(rows, targets, tests, label, show):
    """A markdown table: a line per test (`label(test)` first), a column per target with
    `show(row)` of its row for the test, or "-" where it has none."""
    lines = ["| test | " + " | ".join(targets) + " |", "|---|" + "---:|" * len(targets)]
    for test in tests:
        cells = [show(r) if (r := cell(rows, t, test)) else "-" for t in targets]
        lines.append(f"| {label(test)} | " + " | ".join(cells) + " |")
    return lines


out = []
out.append("# zcfs benchmark results\n")
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p' | head -1"], capture_output=True, text=True).stdout.strip()
out.append(f"Machine: {os.cpu_count()} vCPU ({cpu}), kernel {platform.release()}, "
           f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB. "
           f"Run: `{os.path.basename(os.path.normpath(run))}`. All figures of one table come from the same run; "
           "the machine is a shared 2-vCPU VM, so differences under about 10 % are noise.\n")

# ---------------------------------------------------------------- headline
nfs = [r for r in fio if r["target"] == "ganesha-libnfs"]
out.append("## Headline\n")
lines = []
for op, rw in [("read", "randread"), ("write", "randwrite")]:
    for size in [1 * KIB, 4 * KIB, 1 << 20]:
        z = zrow(remote["rows"], "zcfs", op, "rand", size, 1)
        n = frow("ganesha-libnfs", rw, size)
        zf = frow("zcfs-remote-fuse", rw, size)
        s = frow("sshfs", rw, size)
        cells = [f"{op} {human(size)}"]
        cells.append(fmt(z["p50_us"]) if z else "-")
        cells.append(fmt(num(n["lat_p50_us"])) if n else "-")
        cells.append(ratio(num(n["lat_p50_us"]) if n else None, z["p50_us"] if z else None))
        cells.append(fmt(num(zf["lat_p50_us"])) if zf else "-")
        cells.append(fmt(num(s["lat_p50_us"])) if s else "-")
        cells.append(ratio(num(s["lat_p50_us"]) if s else None, num(zf["lat_p50_us"]) if zf else None))
        lines.append("| " + " | ".join(cells) + " |")
out.append("QD1 random I/O, p50 latency in µs (lower is better); ratios say how many times faster zcfs is.\n")
out.append("| op | zcfs library | NFS (libnfs) | NFS / zcfs | zcfs FUSE (remote) | sshfs | sshfs / zcfs FUSE |")
out.append("|---|---:|---:|---:|---:|---:|---:|")
out += lines
out.append("")
for op in ["read", "write"]:
    st = zrow(remote["rows"], "raw-tcp-stream", op, "-", 1 << 20, 0)
    z = zrow(remote["rows"], "zcfs", op, "seq", 1 << 20, 16)
    if st and z:
        out.append(f"- 1 MiB {op}s, client library at QD16: {z['mb_s']:.0f} MB/s = {100 * z['mb_s'] / st['mb_s']:.0f} % of the raw TCP streaming bandwidth on the same link ({st['mb_s']:.0f} MB/s).")
for op, rw in [("read", "read"), ("write", "write")]:
    n = frow("ganesha-libnfs", rw, 1 << 20)
    z = zrow(remote["rows"], "zcfs", op, "seq", 1 << 20, 1)
    if n and z:
        out.append(f"- 1 MiB sequential {op}s at QD1: zcfs {z['mb_s']:.0f} MB/s, NFS {num(n['mbps']):.0f} MB/s ({ratio(z['mb_s'], num(n['mbps']))}).")
out.append("")

# ---------------------------------------------------------------- layer 2 beside TCP (issue 12)
LANE_CASES = [(op, s, q) for op in ["read", "write"]
              for s, q in [(1 * KIB, 1), (4 * KIB, 1), (16 * KIB, 1), (1 << 20, 1), (1 << 20, 16)]]


def lrow(transport, op, size, qd, poll):
    """A row of `zcfs-bench remote --transport tcp,l2`'s comparison (system zcfs-lane) in
    lane poll mode `poll` (rows of runs before the mode was recorded: None)."""
    return next((r for r in remote["rows"] if r["system"] == "zcfs-lane" and r.get("transport") == transport
                 and r["op"] == op and r["size"] == size and r["qd"] == qd and r.get("l2_poll") == poll), None)


lane_polls = list(dict.fromkeys(r.get("l2_poll") for r in remote["rows"] if r["system"] == "zcfs-lane"))
lane_any = False
lane_sets = []  # (poll, cases) per lane poll mode, for the plot
for poll in lane_polls:
    lane_cases = [(op, s, q, lrow("tcp", op, s, q, poll), lrow("l2", op, s, q, poll)) for op, s, q in LANE_CASES]
    lane_cases = [c for c in lane_cases if c[3] and c[4]]
    if not lane_cases:
        continue
    lane_any = True
    lane_sets.append((poll, lane_cases))
    info = ((remote.get("l2_by_poll") or {}).get(poll) if poll else remote.get("l2")) or {}
    client = info.get("client") or {}
    out.append(f"## Layer 2 beside TCP (lane poll mode: {client.get('poll', poll or '?')})\n")
    out.append(f"One `zcfs serve --l2` on the veth pair, one client on TCP and one with the lane, measured in "
               f"alternating rounds (median of the rounds); lane bind mode `{client.get('bind_mode', '?')}`, "
               f"poll `{client.get('poll', '?')}` on both ends (the TCP rows are measured beside that lane). "
               "Ratios below 1.00x: layer 2 faster (p50) or slower (MB/s).\n")
    # NFS (libnfs, QD1 random I/O) in the same run, when the run measured it (--nfs, --full).
    def nfs_p50(op, size, qd):
        n = frow("ganesha-libnfs", "rand" + op, size) if qd == 1 else None
        return num(n["lat_p50_us"]) if n else None
    with_nfs = any(nfs_p50(op, s, q) for op, s, q, _, _ in lane_cases)
    head = "| op | size | QD | TCP p50 µs | L2 p50 µs | L2/TCP p50 | TCP MB/s | L2 MB/s | L2/TCP MB/s |"
    out.append(head + (" NFS p50 µs | L2/NFS p50 |" if with_nfs else ""))
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if with_nfs else ""))
    for op, size, qd, t, l in lane_cases:
        line = (f"| {op} | {human(size)} | {qd} | {t['p50_us']:.1f} | {l['p50_us']:.1f} | {ratio(l['p50_us'], t['p50_us'])} "
                f"| {t['mb_s']:.0f} | {l['mb_s']:.0f} | {ratio(l['mb_s'], t['mb_s'])} |")
        if with_nfs:
            n = nfs_p50(op, size, qd)
            line += f" {fmt(n)} | {ratio(l['p50_us'], n) if n else '-'} |"
        out.append(line)
    reqs = client.get("requests") or {}
    if reqs:
        per = ", ".join(f"{op} {c['l2']}/{c['tcp']}" for op, c in sorted(reqs.items()))
        out.append(f"\nRequests of the lane's client, layer 2/TCP: {per}.")
    out.append("")
# The plot shows the busy-polled lane when the run has it (the mode the lane is for).
plot_poll, lane_cases = next(((p, c) for p, c in lane_sets if p == "busy"), lane_sets[-1] if lane_sets else (None, []))
if not lane_any and remote.get("l2") and remote["l2"].get("skipped"):
    out.append(f"Layer 2 beside TCP: skipped ({remote['l2']['skipped']}).\n")

# ---------------------------------------------------------------- remote library vs raw TCP
def remote_table(data, title):
    rows = data["rows"]
    t = [f"## {title}\n"]
    c = data.get("user_copies_per_payload_byte")
    if c:
        t.append(f"User-space copies per payload byte on the server: {c.get('zero_copy_server')} (zero-copy), {c.get('one_copy_server')} (one-copy). "
                 "CPU is user + system time per operation of client and server together (the raw TCP server runs inside the bench process).\n")
    t += ["| op | size | QD1 p50 zcfs µs | QD1 p50 raw TCP µs | latency ratio | QD1 CPU µs/op zcfs / raw | QD16 zcfs MB/s | QD16 raw TCP MB/s | zcfs / raw | one-copy MB/s | zero / one-copy |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for op in ["read", "write"]:
        for size in SIZES:
            z1, r1 = zrow(rows, "zcfs", op, "seq", size, 1), zrow(rows, "raw-tcp", op, "-", size, 1)
            z16, r16 = zrow(rows, "zcfs", op, "seq", size, 16), zrow(rows, "raw-tcp", op, "-", size, 16)
            if not (z1 and r1 and z16 and r16):
                continue
            oc = zrow(rows, "zcfs-one-copy", op, "seq", size, 16) if op == "write" else None
            # Runs before CPU accounting have no figure: say so rather than print 0.
            cpu = f"{z1['cpu_us_per_op']:.1f} / {r1['cpu_us_per_op']:.1f}" if z1.get("cpu_us_per_op") else "not measured"
            t.append(f"| {op} | {human(size)} | {z1['p50_us']:.1f} | {r1['p50_us']:.1f} | {ratio(z1['p50_us'], r1['p50_us'])} | {cpu} | "
                     f"{z16['mb_s']:.0f} | {r16['mb_s']:.0f} | {100 * z16['mb_s'] / r16['mb_s']:.0f} % | {fmt(oc['mb_s'], 0) if oc else '-'} | {ratio(z16['mb_s'], oc['mb_s']) if oc else '-'} |")
    t.append("")
    return t


out += remote_table(remote, f"Client library across {remote.get('link', 'veth')} vs raw TCP on the same link (median of {remote.get('repeat', 1)} runs)")
if tbf:
    out += remote_table(tbf, "The same over a 1 Gbit/s veth (tc tbf)")

# ---------------------------------------------------------------- fio on file systems
targets = [t for t in ["tmpfs", "zcfs-local-fuse", "zcfs-remote-fuse", "sshfs", "fuse-hp"] if any(r["target"] == t for r in fio)]
tests = distinct(fio, "test", lambda r: r["target"] in targets)
out.append("## fio on each file system (p50 µs / MB/s)\n")
out.append("| test | " + " | ".join(targets) + " | zcfs remote FUSE / sshfs |")
out.append("|---|" + "---:|" * (len(targets) + 1))
for test in tests:
    cells = []
    vals = {}
    for t in targets:
        r = cell(fio, t, test)
        vals[t] = r
        cells.append(f"{fmt(num(r['lat_p50_us']))} / {fmt(num(r['mbps']), 0)}" if r else "-")
    zr, sr = vals.get("zcfs-remote-fuse"), vals.get("sshfs")
    rat = ratio(num(zr["mbps"]), num(sr["mbps"])) + " MB/s" if zr and sr else "-"
    out.append(f"| {test} | " + " | ".join(cells) + f" | {rat} |")
out.append("")

# ---------------------------------------------------------------- CPU per operation on the FUSE paths
if cpu_rows:
    ctargets = [t for t in ["tmpfs", "zcfs-local-fuse", "zcfs-remote-fuse"] if any(r["target"] == t for r in cpu_rows)]
    ctests = distinct(cpu_rows, "test", lambda r: r["target"] != "zcfs-null")
    out.append("## CPU per operation through the file systems (µs: fio + the file system's processes)\n")
    out.append("fio's user+system time per I/O (the kernel's FUSE and page-cache work lands here) plus the zcfs mount (and server, for remote) processes' time.\n")
    out += grid(cpu_rows, ctargets, ctests, str, lambda r: f"{float(r['fio_cpu_us_per_op']) + float(r['fs_cpu_us_per_op']):.1f}")
    out.append("")

# ---------------------------------------------------------------- NFS per size
if nfs:
    out.append("## zcfs client library vs NFS-Ganesha (libnfs client), QD1 p50 µs\n")
    out.append("| op | size | zcfs | NFS | NFS / zcfs |")
    out.append("|---|---:|---:|---:|---:|")
    for op, rw in [("read", "randread"), ("write", "randwrite"), ("read", "read"), ("write", "write")]:
        pat = "rand" if rw.startswith("rand") else "seq"
        for size in SIZES:
            z, n = zrow(remote["rows"], "zcfs", op, pat, size, 1), frow("ganesha-libnfs", rw, size)
            if z and n:
                out.append(f"| {rw} | {human(size)} | {z['p50_us']:.1f} | {num(n['lat_p50_us']):.1f} | {ratio(num(n['lat_p50_us']), z['p50_us'])} |")
    out.append("")

# ---------------------------------------------------------------- null backend QD sweep
null = [r for r in fio if r["target"] == "zcfs-null"]
if null:
    out.append("## FUSE frontend cost: null backend, random reads vs queue depth (kIOPS)\n")
    qds = sorted({int(r["qd"]) for r in null})
    out.append("| block | " + " | ".join(f"QD{q}" for q in qds) + " |")
    out.append("|---|" + "---:|" * len(qds))
    for bs in ["4k", "16k", "64k"]:
        cells = []
        for q in qds:
            r = next((x for x in null if x["bs"] == bs and int(x["qd"]) == q), None)
            cells.append(fmt(num(r["iops"]) / 1000 if r else None))
        out.append(f"| {bs} | " + " | ".join(cells) + " |")
    out.append("")

# ---------------------------------------------------------------- local ablations
lrows = local["rows"]
if lrows:
    def lfind(system, size):
        return next((r for r in lrows if r["system"] == system and r["size"] == size), None)
    out.append("## Consistency cost (CCM): log with synchronous commit, log with group commit, no log (p50 µs per write)\n")
    out.append("| size | log, sync | log, batched | no log | log cost (sync / no log) |")
    out.append("|---:|---:|---:|---:|---:|")
    for size in [1 * KIB, 4 * KIB, 64 * KIB, 1 << 20]:
        s, b, n = lfind("consistency-log-sync", size), lfind("consistency-log-batched", size), lfind("consistency-no-log", size)
        if s and b and n:
            out.append(f"| {human(size)} | {s['p50_us']:.2f} | {b['p50_us']:.2f} | {n['p50_us']:.2f} | {100 * (s['p50_us'] / n['p50_us'] - 1):+.1f} % |")
    out.append("\n## Page attach (FLAC zcopy_to) vs a copying read, every page touched (p50 µs)\n")
    out.append("| size | zcopy_to | copying read | attach / copy |")
    out.append("|---:|---:|---:|---:|")
    for size in [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1 << 20, 2 << 20]:
        a, c = lfind("zcopy_to", size), lfind("copying-read", size)
        if a and c:
            out.append(f"| {human(size)} | {a['p50_us']:.2f} | {c['p50_us']:.2f} | {ratio(a['p50_us'], c['p50_us'])} |")
    out.append("\n## Local library API (volume on /dev/shm, group commit): p50 µs / MB/s\n")
    out.append("| op | size | seq QD1 | rand QD1 | seq QD16 | rand QD16 | CPU µs/op (rand QD1) |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for op in ["read", "write"]:
        for size in SIZES:
            cells = []
            for pat, qd in [("seq", 1), ("rand", 1), ("seq", 16), ("rand", 16)]:
                r = zrow(lrows, "zcfs-lib-local", op, pat, size, qd)
                cells.append(f"{r['p50_us']:.2f} / {r['mb_s']:.0f}" if r else "-")
            r1 = zrow(lrows, "zcfs-lib-local", op, "rand", size, 1)
            if any(c != "-" for c in cells):
                out.append(f"| {op} | {human(size)} | " + " | ".join(cells) + f" | {fmt(r1.get('cpu_us_per_op') if r1 else None, 2)} |")
    out.append("")

# ---------------------------------------------------------------- small files
if small:
    out.append("## Small files and real tools (seconds; lower is better)\n")
    stargets = distinct(small, "target")
    stests = distinct(small, "test")
    count = {x["test"]: x["count"] for x in reversed(small)}  # the first row's count
    out += grid(small, stargets, stests, lambda t: f"{t} ({count[t]})", lambda r: r["seconds"])
    out.append("")

# ---------------------------------------------------------------- plots
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    plt = None
    print("plots skipped: matplotlib is not installed for this python (apt-get install python3-matplotlib)", file=sys.stderr)
made = []
if plt:
    def save(fig, name, caption):
        p = os.path.join(plots, name)
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append((name, caption))

    # Latency vs size (RZCFS-style).
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (op, rw) in zip(axes, [("read", "randread"), ("write", "randwrite")]):
        series = {
            "zcfs library (remote)": [zrow(remote["rows"], "zcfs", op, "rand", s, 1) for s in SIZES],
            "raw TCP round trip": [zrow(remote["rows"], "raw-tcp", op, "-", s, 1) for s in SIZES],
        }
        for name, rs in series.items():
            xs = [s for s, r in zip(SIZES, rs) if r]
            ax.plot(xs, [r["p50_us"] for r in rs if r], marker="o", label=name)
        for t, label in [("ganesha-libnfs", "NFS (libnfs)"), ("zcfs-remote-fuse", "zcfs FUSE (remote)"), ("sshfs", "sshfs"), ("zcfs-local-fuse", "zcfs FUSE (local)"), ("tmpfs", "tmpfs")]:
            pts = [(s, num(frow(t, rw, s)["lat_p50_us"])) for s in SIZES if frow(t, rw, s)]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", linestyle="--", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("record size (bytes)")
        ax.set_ylabel("p50 latency (µs), QD1")
        ax.set_title(f"random {op}s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    save(fig, "latency_vs_size.png", "QD1 latency vs record size: zcfs, raw TCP and the baselines")

    # Throughput vs size, QD16.
    fig, ax = plt.subplots(figsize=(6, 4))
    for sysname, label in [("zcfs", "zcfs"), ("raw-tcp", "raw TCP")]:
        for op in ["read", "write"]:
            rs = [zrow(remote["rows"], sysname, op, "seq" if sysname == "zcfs" else "-", s, 16) for s in SIZES]
            xs = [s for s, r in zip(SIZES, rs) if r]
            if xs:
                ax.plot(xs, [r["mb_s"] for r in rs if r], marker="o", label=f"{label} {op}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("record size (bytes)")
    ax.set_ylabel("MB/s at QD16")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, "throughput_vs_size.png", "QD16 throughput vs record size, zcfs client library vs raw TCP")

    # Zero vs one copy (RZCFS Fig. 9).
    zs = [(s, zrow(remote["rows"], "zcfs", "write", "seq", s, 16), zrow(remote["rows"], "zcfs-one-copy", "write", "seq", s, 16)) for s in SIZES]
    zs = [z for z in zs if z[1] and z[2]]
    if zs:
        fig, ax = plt.subplots(figsize=(6, 4))
        x = range(len(zs))
        ax.bar([i - 0.2 for i in x], [z[1]["mb_s"] for z in zs], 0.4, label="zero-copy")
        ax.bar([i + 0.2 for i in x], [z[2]["mb_s"] for z in zs], 0.4, label="one-copy")
        ax.set_xticks(list(x), [human(z[0]) for z in zs])
        ax.set_ylabel("write MB/s at QD16")
        ax.legend()
        save(fig, "zero_vs_one_copy.png", "Zero-copy vs one-copy writes (RZCFS Fig. 9)")

    # TCP vs layer 2 by op and size (issue 12).
    if lane_cases:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, key, qdsel, ylabel in [(axes[0], "p50_us", lambda q: q == 1, "p50 µs (QD1, lower is better)"),
                                       (axes[1], "mb_s", lambda q: True, "MB/s (higher is better)")]:
            cs = [c for c in lane_cases if qdsel(c[2])]
            x = range(len(cs))
            ax.bar([i - 0.2 for i in x], [c[3][key] for c in cs], 0.4, label="TCP")
            ax.bar([i + 0.2 for i in x], [c[4][key] for c in cs], 0.4, label="layer 2")
            ax.set_xticks(list(x), [f"{c[0]}\n{human(c[1])}\nQD{c[2]}" for c in cs], fontsize=7)
            ax.set_ylabel(ylabel)
            if key == "p50_us":
                ax.set_yscale("log")
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=8)
        save(fig, "tcp_vs_l2.png", f"TCP vs the layer-2 lane ({plot_poll or 'one'} poll) by op and size, same server and veth pair, one run")

    # Consistency (CCM).
    if lrows:
        cs = [1 * KIB, 4 * KIB, 64 * KIB, 1 << 20]
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, (sysname, label) in enumerate([("consistency-log-sync", "log, sync"), ("consistency-log-batched", "log, batched"), ("consistency-no-log", "no log")]):
            vals = [next((r["p50_us"] for r in lrows if r["system"] == sysname and r["size"] == s), 0) for s in cs]
            ax.bar([j + (i - 1) * 0.27 for j in range(len(cs))], vals, 0.27, label=label)
        ax.set_xticks(range(len(cs)), [human(s) for s in cs])
        ax.set_yscale("log")
        ax.set_ylabel("p50 µs per write")
        ax.legend()
        save(fig, "consistency.png", "Cost of consistency (CCM Figs. 7-8)")
        zsz = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1 << 20, 2 << 20]
        fig, ax = plt.subplots(figsize=(6, 4))
        for sysname in ["zcopy_to", "copying-read"]:
            pts = [(s, next((r["p50_us"] for r in lrows if r["system"] == sysname and r["size"] == s), None)) for s in zsz]
            pts = [p for p in pts if p[1]]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=sysname)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel("p50 µs")
        ax.legend()
        save(fig, "zcopy.png", "Page attach (zcopy_to) vs copying read (FLAC)")

    if null:
        fig, ax = plt.subplots(figsize=(6, 4))
        for bs in ["4k", "16k", "64k"]:
            pts = sorted((int(r["qd"]), num(r["iops"]) / 1000) for r in null if r["bs"] == bs)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=bs)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("queue depth")
        ax.set_ylabel("kIOPS")
        ax.legend()
        save(fig, "null_qd.png", "FUSE null backend vs queue depth (DPFS Fig. 2a)")

    if small:
        stg = distinct(small, "target")
        sts = distinct(small, "test")
        fig, ax = plt.subplots(figsize=(7, 4))
        w = 0.8 / len(stg)
        for i, tg in enumerate(stg):
            vals = [float((cell(small, tg, t) or {"seconds": 0})["seconds"]) for t in sts]
            ax.bar([j + (i - (len(stg) - 1) / 2) * w for j in range(len(sts))], vals, w, label=tg)
        ax.set_xticks(range(len(sts)), sts)
        ax.set_ylabel("seconds")
        ax.legend(fontsize=8)
        save(fig, "smallfiles.png", "Small files and real tools")

for name, caption in made:
    out.append(f"![{caption}](plots/{name})\n")

md = "\n".join(out)
open(os.path.join(run, "results.md"), "w").write(md)
print(md)
if publish:
    img = os.path.join(publish, "img")
    os.makedirs(img, exist_ok=True)
    for name, _ in made:
        shutil.copy(os.path.join(plots, name), os.path.join(img, name))
    head = open(os.path.join(publish, "benchmarks-head.md")).read() if os.path.exists(os.path.join(publish, "benchmarks-head.md")) else ""
    open(os.path.join(publish, "benchmarks.md"), "w").write(head + md.replace("](plots/", "](img/"))
