#!/usr/bin/env python3
"""Sort `perf report --sort comm,sym -g none` lines of a zcfs mount profile into kinds of
work, by who (the application, the mount, the server) and what (copies, page faults, ...).
Samples of other processes on the machine are left out."""
import re
import sys

WHO = [("app", re.compile(r"^dd$")),
       ("mount", re.compile(r"^(fuser-|zcfs-client|zcfs-mount|zcfs$)")),
       ("server", re.compile(r"^(zcfs-conn|zcfs-flusher|zcfs-serve|zcfs-accept)")),
       ("server prefault (background)", re.compile(r"^zcfs-prefault"))]
WHAT = [("copy", r"memcpy|memmove|rep_movs|copy_user|copy_to_iter|copy_from_iter|copy_page"),
        ("page faults", r"page_fault|clear_page|shmem_get_folio|handle_mm_fault|do_fault|filemap_map|folio_"),
        ("persist (msync, flush)", r"msync|clwb|clflush|sfence|wb_|writeback|sync_file|persist"),
        ("log commit", r"zcfs_volume::commit|commit_batch|store_log|Log::"),
        ("block map, allocation", r"FileMap|BlockAlloc|alloc::"),
        ("TCP, socket", r"tcp_|sock_|skb|__dev_queue|ip_|net_rx|netif|loopback|__napi|inet_"),
        ("FUSE device", r"fuse_|request_wait|iov_iter_get_pages|gup_"),
        ("scheduling, wakeups", r"schedule|finish_task_switch|futex|try_to_wake|_raw_spin_unlock_irq|pick_next|enqueue|dequeue"),
        ("syscall entry", r"entry_SYSCALL|do_syscall|syscall_exit|__x64_sys")]
rows = {}
total = 0.0
for line in sys.stdin:
    m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(.*)", line)
    if not m:
        continue
    pct, comm, sym = float(m.group(1)), m.group(2), m.group(3)
    who = next((w for w, r in WHO if r.search(comm)), None)
    if who is None:
        continue
    what = next((k for k, r in WHAT if re.search(r, sym)), "other")
    rows[(who, what)] = rows.get((who, what), 0.0) + pct
    total += pct
if total == 0:
    print("  (no samples of dd, the mount or the server)")
    sys.exit(0)
whos = [w for w, _ in WHO]
whats = [k for k, _ in WHAT] + ["other"]
print(f"  {sys.argv[1]}: share of the samples of dd + mount + server (%)")
print("  | work | " + " | ".join(whos) + " | all |")
print("  |---|" + "---:|" * (len(whos) + 1))
for what in whats:
    vals = [100 * rows.get((w, what), 0.0) / total for w in whos]
    if sum(vals) >= 0.5:
        print(f"  | {what} | " + " | ".join(f"{v:.1f}" for v in vals) + f" | {sum(vals):.1f} |")
sums = [100 * sum(v for (w, _), v in rows.items() if w == who) / total for who in whos]
print("  | **all** | " + " | ".join(f"{v:.1f}" for v in sums) + " | 100 |")
